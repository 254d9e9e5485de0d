"""Ownership supervision (UPSTREAM-TESTS A7): the heartbeat loop, its deadline, reconfirm, and the two
front ends (threaded ``LeaseKeeper``, asyncio ``supervise``). Time is a ``ManualClock`` throughout:
nothing here sleeps through a lease.

The first group drives a small fake run store whose heartbeat/reconfirm answers each test scripts
(writes that fail, hang, or succeed late); the second runs the loop against a real store.
"""

from __future__ import annotations

import asyncio
import threading
import time
import types

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.journal.owner import OwnerId
from fencepost.runstore.heartbeat import HEARTBEAT_INTERVAL, WRITE_TOLERANCE
from fencepost.runstore.outcomes import FenceLost, NotFound, Updated
from fencepost.runstore.ownership import LeaseKeeper, LeaseLost, Supervisor, supervise
from fencepost.runstore.rows import LivenessEvidence

A = OwnerId("host-a", 101, "owner-a")
B = OwnerId("host-a", 202, "owner-b")


def test_write_tolerance_is_derived_not_restated():
    assert WRITE_TOLERANCE.total_seconds() == 19
    assert HEARTBEAT_INTERVAL.total_seconds() == 1


class FakeRuns:
    """Scripted ``runs``: each behaviour is ``ok``, ``fail``, ``hang``, ``lost`` or ``notfound``."""

    def __init__(self) -> None:
        self.heartbeat_mode = "ok"
        self.reconfirm_mode = "ok"
        self.calls: list[tuple[str, int]] = []
        self.reconfirms: list[int] = []
        self.release = threading.Event()  # lets a hung write finish when set
        self.delay_until: dict[int, threading.Event] = {}

    def _answer(self, mode: str, now_ms: int):
        if mode == "fail":
            raise fencepost.RunStoreError("persistence_failed", "heartbeat", "run persistence failed")
        if mode == "hang":
            self.release.wait()
            raise fencepost.RunStoreError("persistence_failed", "heartbeat", "run persistence failed")
        if mode == "hang_ok":
            self.release.wait()
            return Updated(heartbeat_at_ms=now_ms)
        if mode == "lost":
            return FenceLost()
        if mode == "notfound":
            return NotFound()
        return Updated(heartbeat_at_ms=now_ms)

    def get(self, run_id):
        # Supervision reads the run once on entry: every scripted run is A's when supervision starts.
        return types.SimpleNamespace(run_id=run_id, owner=A)

    def heartbeat(self, run_id, owner, now_ms):
        self.calls.append((run_id, now_ms))
        gate = self.delay_until.pop(len(self.calls), None)
        if gate is not None:
            gate.wait()
            return Updated(heartbeat_at_ms=now_ms)
        return self._answer(self.heartbeat_mode, now_ms)

    def heartbeat_many(self, owner, run_ids, now_ms):
        self.calls.append(("*", now_ms))
        return {r: self._answer(self.heartbeat_mode, now_ms) for r in run_ids}

    def reconfirm(self, run_id, owner, now_ms):
        self.reconfirms.append(now_ms)
        return self._answer(self.reconfirm_mode, now_ms)


class FakeJournal:
    def __init__(self) -> None:
        self.entries: list[tuple] = []
        self.fail = False

    def append(self, run_id, event_type, payload, *, owner, source_id, **kw):
        if self.fail:
            raise fencepost.JournalError("fence_lost", "append", "owner does not hold the run")
        self.entries.append((run_id, event_type, payload, owner, source_id))


class FakeStore:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.runs = FakeRuns()
        self.journal = FakeJournal()


@pytest.fixture
def fake(clock):
    return FakeStore(clock)


def advance_to(keeper, clock: ManualClock, ms: int, step: int = 1000) -> None:
    """Move the clock to ``ms`` one interval at a time, letting the loop act at every tick."""
    while clock.now_ms() < ms:
        clock.set(min(ms, clock.now_ms() + step))
        keeper.settle()


def test_pulse_every_interval_with_updated_keeps_the_lease(fake, clock):
    with LeaseKeeper(fake, "r1", A) as keeper:
        advance_to(keeper, clock, 5000)
        assert [t for _, t in fake.runs.calls] == [1000, 2000, 3000, 4000, 5000]
        keeper.check()
        assert not keeper.lost


def test_a_supervisor_stopped_and_started_again_pulses_again(fake, clock):
    """``start()`` after ``stop()`` did nothing (the ended thread still counted as started), so a
    lease held afterwards was never renewed and never lapsed either."""
    sup = Supervisor(fake, A)
    first = sup.hold("r1")
    sup.settle()
    first.release()
    sup.stop()
    sup.start()
    sup.hold("r2")
    advance_to(sup, clock, 2000)
    assert [t for _, t in fake.runs.calls] == [1000, 2000]
    sup.stop()


def test_a_lease_keeper_entered_again_after_it_stopped_pulses_and_fences_again(fake, clock):
    """Entering a ``LeaseKeeper`` a second time kept the first, released lease: nothing renewed the
    run, and ``check()`` could never raise ``LeaseLost`` (a thief's takeover went unnoticed)."""
    keeper = LeaseKeeper(fake, "r1", A)
    with keeper:
        advance_to(keeper, clock, 1000)
    assert [t for _, t in fake.runs.calls] == [1000]
    with keeper:
        advance_to(keeper, clock, 2000)
        assert [t for _, t in fake.runs.calls] == [1000, 2000]  # pulsed again
        fake.runs.heartbeat_mode = "lost"
        advance_to(keeper, clock, 3000)
        with pytest.raises(LeaseLost):
            keeper.check()


@pytest.mark.parametrize("mode,tag", [("lost", "FenceLost"), ("notfound", "NotFound")], ids=["FenceLost", "NotFound"])
def test_any_outcome_other_than_updated_interrupts_without_on_lapse(fake, clock, mode, tag):
    lapses: list[int] = []
    fake.runs.heartbeat_mode = mode
    with LeaseKeeper(fake, "r1", A, on_lapse=lapses.append) as keeper:
        advance_to(keeper, clock, 1000)
        with pytest.raises(LeaseLost) as info:
            keeper.check()
        assert info.value.reason == tag
        assert lapses == []
        advance_to(keeper, clock, 3000)
        assert len(fake.runs.calls) == 1  # a lost lease is not pulsed again


def test_write_failures_are_tolerated_until_the_budget_then_lapse_at_19000(fake, clock, caplog):
    """OW-19: every write fails; one warning for the streak, lapse at 19 000 with unconfirmedMs 19 000."""
    fake.runs.heartbeat_mode = "fail"
    fake.runs.reconfirm_mode = "fail"
    lapses: list[int] = []
    with caplog.at_level("WARNING", logger="fencepost.ownership"), \
            LeaseKeeper(fake, "r1", A, on_lapse=lapses.append) as keeper:
        advance_to(keeper, clock, 18_999)
        keeper.check()
        assert len(fake.runs.calls) == 18
        advance_to(keeper, clock, 19_000)
        with pytest.raises(LeaseLost) as info:
            keeper.check()
    assert info.value.reason == "lapsed"
    assert lapses == [19_000]
    assert fake.runs.reconfirms == [19_000]
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["run r1: heartbeat write failed", "run r1: lease lapsed; interrupting owned work"]


def test_settle_waits_for_a_slow_heartbeat_rather_than_taking_it_for_hung(fake, clock):
    """A heartbeat answering after 0.5 s (a real write on a loaded machine) is waited for: settle()
    returned after 0.2 s while it was in flight, the clock moved on to 2 000 before its answer was
    in, the next heartbeat was put one interval after that (3 000) and the one due at 2 000 never
    came. Only a heartbeat unanswered for a second is taken for hung."""
    # The 0.5 s count from the call's arrival, on the thread making it: a timer started by this
    # thread after ``clock.set`` let a stall between the two lines make the answer come more than
    # a second after the call began, and settle() then rightly took it for hung.
    gate = _AnswersAfter(0.5)
    fake.runs.delay_until[1] = gate
    try:
        with LeaseKeeper(fake, "r1", A) as keeper:
            clock.set(1000)
            keeper.settle()
            assert gate.is_set(), "settle() returned before the heartbeat in flight answered"
            advance_to(keeper, clock, 2000)
            assert [t for _, t in fake.runs.calls] == [1000, 2000]
    finally:
        gate.set()


class _AnswersAfter(threading.Event):
    """A ``delay_until`` gate that opens ``delay`` seconds after the call waiting on it arrived."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def wait(self, timeout: float | None = None) -> bool:
        if not super().wait(self.delay):
            self.set()
        return True


def test_hung_heartbeat_write_cannot_hold_the_deadline_back(fake, clock):
    """OW-16: the first write never completes; alive at 18 999 with one call, interrupted at 19 000."""
    fake.runs.heartbeat_mode = "hang"
    fake.runs.reconfirm_mode = "fail"
    try:
        with LeaseKeeper(fake, "r1", A) as keeper:
            advance_to(keeper, clock, 18_999)
            keeper.check()
            assert len(fake.runs.calls) == 1
            advance_to(keeper, clock, 19_000)
            assert keeper.lost
            advance_to(keeper, clock, 40_000)
            assert len(fake.runs.calls) == 1
    finally:
        fake.runs.release.set()


@pytest.mark.parametrize("late", ["hang", "hang_ok"], ids=["fails-after-35s", "succeeds-after-35s"])
def test_a_write_that_resolves_after_the_deadline_cannot_revive_the_lease(fake, clock, late):
    """OW-17, OW-18: the first write answers only at 35 000; the lease lapsed at 19 000 and stays lost."""
    fake.runs.heartbeat_mode = late
    fake.runs.reconfirm_mode = "fail"
    try:
        with LeaseKeeper(fake, "r1", A) as keeper:
            advance_to(keeper, clock, 19_000)
            assert keeper.lost
            clock.set(35_000)
            fake.runs.release.set()
            _wait_for(lambda: keeper.supervisor._pulse is None)
            advance_to(keeper, clock, 40_000)
            with pytest.raises(LeaseLost) as info:
                keeper.check()
            assert info.value.reason == "lapsed" and len(fake.runs.calls) == 1
    finally:
        fake.runs.release.set()


def test_ownership_re_exports_the_liveness_checks():
    from fencepost.runstore import liveness, ownership

    assert ownership.lease_liveness is liveness.lease_liveness
    assert ownership.same_host_pid_probe is liveness.same_host_pid_probe
    assert ownership.LivenessContext is liveness.LivenessContext


def test_deadline_rearms_from_the_stamp_sent_not_the_completion_time(fake, clock):
    """OW-23: the write sent at 1 000 succeeds at 6 000, later writes hang: lapse at 20 000, not 25 000."""
    gate = threading.Event()
    fake.runs.delay_until[1] = gate
    fake.runs.reconfirm_mode = "fail"
    try:
        with LeaseKeeper(fake, "r1", A) as keeper:
            advance_to(keeper, clock, 6000)
            fake.runs.heartbeat_mode = "hang"
            gate.set()
            _wait_for(lambda: len(fake.runs.calls) >= 1 and keeper.supervisor._pulse is None)
            advance_to(keeper, clock, 19_999)
            keeper.check()
            assert len(fake.runs.calls) == 2
            advance_to(keeper, clock, 20_000)
            with pytest.raises(LeaseLost) as info:
                keeper.check()
            assert info.value.unconfirmed_ms == 19_000
    finally:
        fake.runs.release.set()


@pytest.mark.parametrize(("stall_to", "writes", "lost"), [(18_999, [("r1", 18_999)], False), (19_000, [], True),
                                                       (20_000, [], True)])
def test_a_pulse_past_the_deadline_does_not_renew(fake, clock, stall_to, writes, lost):
    """OW-20..22: the host stalls (one clock jump from 0 to ``stall_to``): the pulse timer and, from
    19 000, the watchdog are overdue and the pulse runs first. At 18 999 it writes once and the work
    is alive; at 19 000 and 20 000 it writes nothing and the lease has lapsed (a pulse past the
    deadline must not renew)."""
    fake.runs.reconfirm_mode = "fail"
    with LeaseKeeper(fake, "r1", A) as keeper:
        keeper.settle()
        fake.runs.heartbeat_mode = "fail"
        advance_to(keeper, clock, 0)
        clock.set(stall_to)  # one jump: the pulse timer is overdue (and the watchdog from 19 000)
        keeper.settle()
        assert keeper.lost is lost
        assert fake.runs.calls == writes  # no heartbeat write is sent at or after the deadline


def test_reconfirm_success_continues_and_journals_lease_reconfirmed(fake, clock):
    fake.runs.heartbeat_mode = "fail"
    seen: list[int] = []
    with LeaseKeeper(fake, "r1", A, on_reconfirm=seen.append) as keeper:
        advance_to(keeper, clock, 19_000)
        keeper.check()
        assert seen == [19_000]
        assert fake.journal.entries == [
            ("r1", "flows.engine.run-decision",
             {"decision": "lease-reconfirmed", "detail": {"unconfirmedMs": 19_000}}, A, "flows.engine")
        ]
        fake.runs.heartbeat_mode = "ok"
        advance_to(keeper, clock, 40_000)
        keeper.check()
        assert keeper.lease.reconfirmations == 1


def test_a_blocked_on_reconfirm_lapses_at_the_renewed_deadline_without_stalling_other_runs(fake, clock):
    fake.runs.heartbeat_mode = "fail"
    hook = threading.Event()
    lapses: list[int] = []
    with Supervisor(fake, A) as sup:
        slow = sup.hold("slow", on_reconfirm=lambda ms: hook.wait(30), on_lapse=lapses.append)
        advance_to(sup, clock, 19_000)
        assert not slow.lost and slow.reconfirmations == 1
        fake.runs.heartbeat_mode = "ok"
        other = sup.hold("other")
        before = len(fake.runs.calls)
        advance_to(sup, clock, 37_000)
        assert len(fake.runs.calls) > before  # pulses went on while the hook was blocked
        other.check()
        advance_to(sup, clock, 38_000)  # 19 000 (reconfirmed) + 19 000: the receipt never finished
        assert slow.lost and lapses == [19_000]
        other.check()
    hook.set()


def test_an_on_reconfirm_hook_that_raises_lapses_the_lease_and_is_logged_redacted(fake, clock, caplog):
    """Defect (found by a review, no database: the supervisor's own path): an ``on_reconfirm`` hook
    that raised lapsed the lease, as it must (the receipt did not finish), but its error was kept on
    the receipt and never logged: the log said only "lease lapsed". It is now logged as the other
    supervision callbacks are: the traceback redacted, as text, naming the run."""
    import logging

    fake.runs.heartbeat_mode = "fail"
    lapses: list[int] = []

    def on_reconfirm(ms: int) -> None:
        raise RuntimeError("hook failed: tool --password hunter2RC")

    with caplog.at_level(logging.INFO, logger="fencepost.ownership"):
        with LeaseKeeper(fake, "r1", A, on_reconfirm=on_reconfirm, on_lapse=lapses.append) as keeper:
            advance_to(keeper, clock, 20_000)
            _wait_for(lambda: keeper.lost)
            assert keeper.lost and lapses == [19_000]
    failed = [r for r in caplog.records if "supervision callback failed" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in caplog.records]
    text = failed[0].getMessage()
    assert text.startswith("run r1: supervision callback failed") and "RuntimeError" in text
    assert "hunter2RC" not in text and failed[0].exc_info is None


def test_reconfirm_lost_to_a_peer_lapses(fake, clock):
    fake.runs.heartbeat_mode = "fail"
    fake.runs.reconfirm_mode = "lost"
    lapses: list[int] = []
    with LeaseKeeper(fake, "r1", A, on_lapse=lapses.append) as keeper:
        advance_to(keeper, clock, 19_000)
        assert keeper.lost
        assert lapses == [19_000]
        assert fake.journal.entries == []


def test_hung_reconfirm_times_out_after_one_interval(fake, clock):
    fake.runs.heartbeat_mode = "fail"
    fake.runs.reconfirm_mode = "hang"
    try:
        with LeaseKeeper(fake, "r1", A) as keeper:
            advance_to(keeper, clock, 18_000)
            clock.set(19_000)
            _wait_for(lambda: fake.runs.reconfirms == [19_000])
            clock.set(19_999)
            time.sleep(0.05)
            assert not keeper.lost
            clock.set(20_000)
            _wait_for(lambda: keeper.lost)
    finally:
        fake.runs.release.set()


def test_failed_reconfirm_receipt_lapses_the_lease(fake, clock):
    fake.runs.heartbeat_mode = "fail"
    fake.journal.fail = True
    with LeaseKeeper(fake, "r1", A) as keeper:
        advance_to(keeper, clock, 19_000)
        assert keeper.lost


def test_many_leases_renew_with_one_heartbeat_many_per_interval(fake, clock):
    with Supervisor(fake, A) as sup:
        leases = [sup.hold(f"r{i}") for i in range(3)]
        advance_to(sup, clock, 3000)
        assert fake.runs.calls == [("*", 1000), ("*", 2000), ("*", 3000)]
        leases[0].release()
        leases[1].release()
        advance_to(sup, clock, 4000)
        assert fake.runs.calls[-1] == ("r2", 4000)


def _wait_for(pred, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


async def _until(pred, timeout: float = 10.0) -> None:
    """``_wait_for`` on an event loop: poll ``pred()`` between short sleeps, so the loop runs on."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


# ------------------------------------------------------------------------------------------- asyncio
def test_supervise_cancels_the_owned_task_on_a_lost_fence(fake, clock):
    fake.runs.heartbeat_mode = "lost"
    reached: list[str] = []

    async def owned():
        async with supervise(fake, "r1", A):
            reached.append("started")
            while True:
                await asyncio.sleep(0.005)

    async def main():
        task = asyncio.create_task(owned())
        # The lease is held (off the loop, in a thread) before the body runs: a clock moved on
        # before the hold would start the lease at 1 000, and no pulse would come at 1 000.
        await _until(lambda: reached)
        clock.set(1000)
        with pytest.raises(LeaseLost) as info:
            await asyncio.wait_for(task, 5)
        return info.value

    err = asyncio.run(main())
    assert reached == ["started"]
    assert err.reason == "FenceLost"


def test_supervise_lapse_calls_on_lapse_then_cancels(fake, clock):
    fake.runs.heartbeat_mode = "fail"
    fake.runs.reconfirm_mode = "fail"
    lapses: list[int] = []

    async def owned():
        async with supervise(fake, "r1", A, on_lapse=lapses.append) as lease:
            while True:
                await asyncio.sleep(0.005)
                if clock.now_ms() < 19_000:
                    lease.supervisor.settle()
                    clock.advance(1000)

    async def main():
        with pytest.raises(LeaseLost):
            await asyncio.wait_for(owned(), 10)

    asyncio.run(main())
    assert lapses == [19_000]


def test_a_shared_supervisor_cancels_only_the_task_whose_fence_was_lost(fake, clock):
    lost_runs = {"r2"}
    fake.runs.heartbeat_many = lambda owner, run_ids, now_ms: {
        r: (FenceLost() if r in lost_runs else Updated(heartbeat_at_ms=now_ms)) for r in run_ids}
    sup = Supervisor(fake, A)

    async def owned(run_id: str, ticks: int):
        async with supervise(fake, run_id, A, supervisor=sup):
            for _ in range(ticks):
                await asyncio.sleep(0.01)
        return run_id

    async def main():
        t1 = asyncio.create_task(owned("r1", 100))
        t2 = asyncio.create_task(owned("r2", 10_000))
        # Both runs held before the clock moves: a run held only afterwards is first pulsed at 2 000.
        await _until(lambda: sorted(sup.held()) == ["r1", "r2"])
        clock.set(1000)
        results = await asyncio.wait_for(asyncio.gather(t1, t2, return_exceptions=True), 10)
        return results

    try:
        first, second = asyncio.run(main())
    finally:
        sup.stop()
    assert first == "r1"
    assert isinstance(second, LeaseLost) and second.reason == "FenceLost"


def test_supervise_body_that_finishes_is_not_cancelled(fake, clock):
    async def main():
        async with supervise(fake, "r1", A):
            await asyncio.sleep(0.01)
        return "done"

    assert asyncio.run(main()) == "done"


# ------------------------------------------------------------------------------------------- real store
def advance_real(keeper, clock: ManualClock, ms: int, step: int = 1000) -> None:
    """``advance_to`` for a real store: at each tick wait for the pulse's answer before moving on.

    ``settle()`` counts a pulse in flight for more than a moment as hung (the fake-store tests need
    that); a real write slowed by a loaded machine is not hung, and the clock must not pass a
    deadline before its answer is in."""
    while clock.now_ms() < ms:
        clock.set(min(ms, clock.now_ms() + step))
        keeper.settle()
        _wait_for(lambda: keeper.supervisor._pulse is None)
        keeper.settle()


def _activate(store, run_id, owner):
    store.runs.create(run_id, "{}")
    row = store.runs.get(run_id)
    claimed = store.runs.claim(run_id, row.snapshot(), owner, store.clock.now_ms())
    assert type(claimed).__name__ == "Claimed"
    activated = store.runs.activate(run_id, owner, claimed.claimed_at_ms, row)
    assert type(activated).__name__ == "Activated"


def test_keeper_renews_a_real_lease_and_stops_on_steal(store, clock):
    _activate(store, "r1", A)
    with LeaseKeeper(store, "r1", A) as keeper:
        advance_real(keeper, clock, 5000)
        assert store.runs.get("r1").heartbeat_at_ms == 5000
        keeper.check()
        # The owner stalls (no pulses) long enough for a peer to steal and activate.
        keeper.supervisor.stop()
        clock.set(35_001)
        row = store.runs.get("r1")
        evidence = LivenessEvidence(A, 35_001, "lease-expired")
        claimed = store.runs.steal("r1", row, B, 35_001, evidence)
        assert type(claimed).__name__ == "Claimed"
        assert type(store.runs.activate("r1", B, claimed.claimed_at_ms, row)).__name__ == "Activated"
    # Entering again reads the run once: the fence is already B's, so the keeper refuses at once.
    with pytest.raises(LeaseLost) as info:
        with LeaseKeeper(store, "r1", A):
            raise AssertionError("the body ran")
    assert info.value.reason == "FenceLost"


def test_reconfirm_on_a_real_store_journals_on_the_runs_own_stream(store, clock):
    _activate(store, "r1", A)
    sup = Supervisor(store, A)
    lease = sup.hold("r1")
    # Make every heartbeat write fail while reconfirm still reaches the store.
    real = store.runs.heartbeat

    def failing(*a, **k):
        raise fencepost.RunStoreError("persistence_failed", "heartbeat", "run persistence failed")

    store.runs.heartbeat = failing

    def decisions() -> list:
        page = store.journal.entries("r1")
        return [e.payload for e in page.entries if e.event_type == "flows.engine.run-decision"]

    try:
        with sup:
            advance_to(sup, clock, 19_000)
            # The receipt (the journal entry) is written beside the loop after the reconfirm, and
            # settle() stops waiting for it after a short grace: on a loaded machine it is still on
            # its way. Wait for it, then settle() so the loop has taken in how it went.
            _wait_for(lambda: decisions() != [], timeout=10)
            sup.settle()
            lease.check()
    finally:
        store.runs.heartbeat = real
    assert store.runs.get("r1").heartbeat_at_ms == 19_000
    assert decisions() == [{"decision": "lease-reconfirmed", "detail": {"unconfirmedMs": 19_000}}]


def test_settle_on_a_supervisor_never_started_returns_at_once(fake, clock):
    """``settle()`` before the first ``hold`` waited its whole timeout and raised ``TimeoutError``
    ("did not settle"), though a supervisor with no loop has nothing to settle (a stopped one
    already returned at once)."""
    sup = Supervisor(fake, A)
    began = time.monotonic()
    sup.settle(timeout=2)
    assert time.monotonic() - began < 1
    keeper = LeaseKeeper(fake, "r1", A)
    keeper.settle(timeout=2)
    assert time.monotonic() - began < 1 and fake.runs.calls == []


# ------------------------------------------------------------------- the 19 s budget on a real store
class _Writes:
    """Wrap a real store's heartbeat, heartbeat_many and reconfirm: record every pulse's outcome, and
    fail the writes with ``persistence_failed`` while ``failing`` is set."""

    def __init__(self, store) -> None:
        self.failing = False
        self.pulses: list[tuple[int, str]] = []
        runs = store.runs
        real_hb, real_many, real_re = runs.heartbeat, runs.heartbeat_many, runs.reconfirm

        def fail():
            raise fencepost.RunStoreError("persistence_failed", "heartbeat", "run persistence failed")

        def heartbeat(run_id, owner, now_ms):
            if self.failing:
                self.pulses.append((now_ms, "failure"))
                fail()
            outcome = real_hb(run_id, owner, now_ms)
            self.pulses.append((now_ms, type(outcome).__name__))
            return outcome

        def heartbeat_many(owner, run_ids, now_ms):
            if self.failing:
                self.pulses.append((now_ms, "failure"))
                fail()
            answers = real_many(owner, run_ids, now_ms)
            self.pulses.extend((now_ms, type(o).__name__) for o in answers.values())
            return answers

        def reconfirm(run_id, owner, now_ms):
            if self.failing:
                fail()
            return real_re(run_id, owner, now_ms)

        runs.heartbeat, runs.heartbeat_many, runs.reconfirm = heartbeat, heartbeat_many, reconfirm


def test_a_pulse_answered_fence_lost_interrupts_the_owned_work(store, clock):
    """RS-31: A owns, the loop runs; at 1 000 the pulse is ``Updated`` (row heartbeat 1 000); A's run
    is suspended; the 2 000 pulse answers ``FenceLost`` and the owned work is interrupted, not failed
    (no lapse, no reconfirm)."""
    _activate(store, "r1", A)
    writes = _Writes(store)
    lapses: list[int] = []
    with LeaseKeeper(store, "r1", A, on_lapse=lapses.append) as keeper:
        advance_real(keeper, clock, 1000)
        assert writes.pulses == [(1000, "Updated")]
        assert store.runs.get("r1").heartbeat_at_ms == 1000
        keeper.check()
        assert type(store.runs.transition_owned("r1", A, "suspended")).__name__ == "Transitioned"
        advance_real(keeper, clock, 2000)
        assert writes.pulses == [(1000, "Updated"), (2000, "FenceLost")]
        with pytest.raises(LeaseLost) as info:
            keeper.check()
    assert info.value.reason == "FenceLost" and lapses == []


def test_always_failing_writes_keep_the_work_alive_until_exactly_19000(store, clock):
    """RS-32, RS-33, RS-35: every heartbeat (and the reconfirm) fails ``persistence_failed``: the work
    is alive at 5 000 and at 18 999, interrupted exactly at 19 000 (not a pulse later), long before
    the stamp it last wrote (0) is stealable at 30 001; it stays interrupted."""
    _activate(store, "r1", A)
    writes = _Writes(store)
    writes.failing = True
    lapses: list[int] = []
    with LeaseKeeper(store, "r1", A, on_lapse=lapses.append) as keeper:
        advance_real(keeper, clock, 5000)
        keeper.check()
        advance_real(keeper, clock, 18_999)
        keeper.check()
        assert not keeper.lost and lapses == []
        advance_real(keeper, clock, 19_000, step=1)
        assert keeper.lost and lapses == [19_000]
        advance_real(keeper, clock, 29_999)
        with pytest.raises(LeaseLost) as info:
            keeper.check()
    assert info.value.reason == "lapsed" and info.value.unconfirmed_ms == 19_000
    assert store.runs.get("r1").heartbeat_at_ms == 0


def test_one_successful_pulse_rearms_the_whole_budget(store, clock):
    """RS-34: writes fail until 17 000, the 18 000 pulse succeeds, then they fail again: at 36 000
    (clock past 30 000, 18 s after the success) the work is alive; the budget from 18 000 runs out
    at 37 000."""
    _activate(store, "r1", A)
    writes = _Writes(store)
    writes.failing = True
    with LeaseKeeper(store, "r1", A) as keeper:
        advance_real(keeper, clock, 17_000)
        writes.failing = False
        advance_real(keeper, clock, 18_000)
        assert writes.pulses[-1] == (18_000, "Updated")
        writes.failing = True
        advance_real(keeper, clock, 36_000)
        keeper.check()
        assert clock.now_ms() > 30_000 and not keeper.lost
        advance_real(keeper, clock, 37_000)
        with pytest.raises(LeaseLost) as info:
            keeper.check()
    assert info.value.reason == "lapsed"
    assert store.runs.get("r1").heartbeat_at_ms == 18_000
