"""Holding a run under a ``Supervisor``: one lease per run, entering verifies ownership at once, and a
shared supervisor that is stopping never blocks the event loop (real store, both backends,
``ManualClock``). Each test's docstring says what was wrong.
"""

from __future__ import annotations

import asyncio
import threading
import time
from functools import partial

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.runstore.ownership import LeaseKeeper, LeaseLost, Supervisor, supervise
from fencepost.runstore.rows import LivenessEvidence
from tests.conftest import eventually, race_threads
from tests.runstore.conftest import A, B, activate_new


def _steal(store: fencepost.Store, run_id: str) -> None:
    """The store's clock passes STALE_AFTER; B steals ``run_id`` from A and activates it."""
    store.clock.set(store.clock.now_ms() + 35_001)
    now = store.clock.now_ms()
    row = store.runs.get(run_id)
    claimed = store.runs.steal(run_id, row, B, now, LivenessEvidence(A, now, "lease-expired"))
    assert type(claimed).__name__ == "Claimed"
    assert type(store.runs.activate(run_id, B, claimed.claimed_at_ms, row)).__name__ == "Activated"


# How long the ``on_lost`` hook below waits to be let go: past every wait of the tests using it, so
# a hook that had to wait this long was not let go by the test.
HOOK_S = 20.0


def _stopping_in_on_lost(store: fencepost.Store, let_go: threading.Event,
                         ended: list[bool]) -> Supervisor:
    """A supervisor of A (own clock) that holds the running run ``r1``, loses it (settled behind its
    back), and is told to stop while its loop thread sits in the ``on_lost`` hook until ``let_go`` is
    set (``HOOK_S`` at most). ``ended`` gets True when the hook was let go, False when it gave up."""
    owner_clock = ManualClock(0)
    sup = Supervisor(store, A, clock=owner_clock)
    in_hook = threading.Event()

    def slow_on_lost(lease: object) -> None:
        in_hook.set()
        ended.append(let_go.wait(HOOK_S))

    sup.hold("r1", on_lost=slow_on_lost)
    store.runs.transition_owned("r1", A, "completed")  # the next pulse answers FenceLost
    owner_clock.set(1000)
    assert in_hook.wait(5)
    sup.stop(timeout=0)  # stopping, its thread still inside the hook
    return sup


def test_a_second_hold_of_a_held_run_is_refused_and_the_first_lease_still_fences(store):
    """A second ``hold`` of a run the supervisor already held replaced the first lease silently:
    the first ``Lease.check()`` could never raise again, so code still holding it went on as if
    fenced-safe after a peer had stolen the run."""
    activate_new(store, "r1", A)
    owner_clock = ManualClock(0)
    sup = Supervisor(store, A, clock=owner_clock)
    try:
        first = sup.hold("r1")
        with pytest.raises(fencepost.RunStoreError) as info:
            sup.hold("r1")
        assert info.value.code == "invalid_run" and "run_id" in str(info.value) and "r1" not in str(info.value)
        assert sup.held() == ["r1"]
        _steal(store, "r1")
        owner_clock.set(1000)  # the next pulse finds the run taken
        sup.settle()
        assert eventually(lambda: first.lost)  # (a slow pulse may outlast settle()'s grace)
        with pytest.raises(LeaseLost) as lost:
            first.check()
        assert lost.value.reason == "FenceLost"
    finally:
        sup.stop()


def test_a_run_held_again_after_release_or_loss_gets_a_new_lease_and_the_old_one_stays_lost(store):
    """Regression guard for the refusal above: a released or lost lease does not block a new hold,
    and the old lost lease keeps reporting the loss."""
    activate_new(store, "r1", A)
    owner_clock = ManualClock(0)
    sup = Supervisor(store, A, clock=owner_clock)
    try:
        first = sup.hold("r1")
        first.release()
        second = sup.hold("r1")
        assert second is not first and sup.held() == ["r1"]
        _steal(store, "r1")
        owner_clock.set(1000)
        sup.settle()
        assert eventually(lambda: second.lost)  # (a slow pulse may outlast settle()'s grace)
        # B's lease expires, A steals the run back and holds it again: a new, live lease.
        store.clock.set(store.clock.now_ms() + 35_001)
        now = store.clock.now_ms()
        row = store.runs.get("r1")
        claimed = store.runs.steal("r1", row, A, now, LivenessEvidence(B, now, "lease-expired"))
        store.runs.activate("r1", A, claimed.claimed_at_ms, row)
        owner_clock.set(now)
        third = sup.hold("r1")
        owner_clock.set(now + 1000)
        sup.settle()
        third.check()
        with pytest.raises(LeaseLost):
            second.check()
    finally:
        sup.stop()


def test_supervise_twice_on_one_shared_supervisor_refuses_the_second_block(store):
    """Two ``supervise`` blocks of one run on one shared supervisor: the second replaced the first's
    lease, so a loss cancelled only the second task and the first ran on unfenced."""
    activate_new(store, "r1", A)
    sup = Supervisor(store, A, clock=ManualClock(0))

    async def main() -> None:
        async with supervise(store, "r1", A, supervisor=sup):
            with pytest.raises(fencepost.RunStoreError) as info:
                async with supervise(store, "r1", A, supervisor=sup):
                    raise AssertionError("the body ran")
            assert info.value.code == "invalid_run"
            assert sup.held() == ["r1"]

    try:
        asyncio.run(asyncio.wait_for(main(), 10))
    finally:
        sup.stop()


@pytest.mark.parametrize("case", ["missing", "other-owner", "settled"])
@pytest.mark.parametrize("front", ["LeaseKeeper", "supervise", "Supervisor.hold"])
def test_entering_supervision_of_a_run_not_owned_fails_at_once(store, case, front):
    """Entering ``supervise``/``LeaseKeeper``/``hold`` for a run that does not exist or that the owner
    does not hold went ahead: the body ran and did its work for one whole interval, until the first
    pulse answered ``NotFound``/``FenceLost``."""
    if case == "other-owner":
        activate_new(store, "r1", B)
    elif case == "settled":
        activate_new(store, "r1", A)
        store.runs.transition_owned("r1", A, "completed")
    expected = "NotFound" if case == "missing" else "FenceLost"
    sup = Supervisor(store, A, clock=ManualClock(0))
    body: list[str] = []

    async def enter() -> None:
        async with supervise(store, "r1", A, supervisor=sup):
            body.append("ran")

    try:
        with pytest.raises(LeaseLost) as info:
            if front == "LeaseKeeper":
                with LeaseKeeper(store, "r1", A, clock=ManualClock(0)):
                    body.append("ran")
            elif front == "supervise":
                asyncio.run(enter())
            else:
                sup.hold("r1")
                body.append("ran")
    finally:
        sup.stop()
    assert info.value.reason == expected and info.value.run_id == "r1"
    assert body == [] and sup.held() == []


def test_supervise_on_a_stopping_shared_supervisor_does_not_block_the_event_loop(store):
    """``supervise`` with a shared supervisor that was stopping joined the old loop thread inside
    ``hold`` on the event loop: while that thread finished (here: a slow ``on_lost`` hook), every
    other coroutine on the loop stood still.

    Told by what ends the hook, not by a wall-clock bound on the loop's stall: only a coroutine on
    the event loop lets the hook go, and the hold cannot end before the hook has (it waits for the
    old loop thread). A loop blocked by the hold would run that coroutine only after the hook gave up
    on its own (``HOOK_S``)."""
    activate_new(store, "r2", A)
    activate_new(store, "r1", A)
    let_go = threading.Event()
    ended: list[bool] = []
    sup = _stopping_in_on_lost(store, let_go, ended)

    async def main() -> None:
        async def release_the_hook() -> None:
            await asyncio.sleep(0.05)  # runs while the block below is entering, if the loop runs at all
            let_go.set()

        releaser = asyncio.create_task(release_the_hook())
        async with supervise(store, "r2", A, supervisor=sup) as lease:
            assert not lease.lost
        await releaser

    try:
        asyncio.run(asyncio.wait_for(main(), 2 * HOOK_S))
    finally:
        let_go.set()
        sup.stop()
    assert ended == [True], "the event loop stood still while supervise waited for the old loop thread"


def test_threads_holding_runs_at_once_on_a_new_supervisor_start_one_loop(store, monkeypatch):
    """Threads calling ``hold`` at once on a supervisor not yet started could each see no loop thread
    and start one: two loops then pulsed (and judged) the same leases side by side."""
    import sys

    ids = [f"r{i}" for i in range(6)]
    for run_id in ids:
        activate_new(store, run_id, A)
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        if self.name == "fencepost-supervisor":
            started.append(self)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, to open the window
    try:
        for _ in range(15):
            started.clear()
            sup = Supervisor(store, A, clock=ManualClock(0))
            race_threads([partial(sup.hold, r, verify=False) for r in ids])
            sup.stop()
            assert len(started) == 1 and sorted(sup.held()) == ids
    finally:
        sys.setswitchinterval(interval)


def test_a_task_cancelled_while_entering_supervise_leaves_no_lease_behind(store):
    """Regression guard for entering off the event loop: a cancellation that lands while the hold
    is still in flight must not leave the run held (pulsed forever by the shared supervisor)."""
    activate_new(store, "r1", A)
    activate_new(store, "r2", A)
    let_go = threading.Event()
    ended: list[bool] = []
    sup = _stopping_in_on_lost(store, let_go, ended)
    body: list[str] = []

    async def owned() -> None:
        async with supervise(store, "r2", A, supervisor=sup):
            body.append("ran")

    async def main() -> None:
        task = asyncio.create_task(owned())
        # Inside the hold: it waits for the old loop to end, which waits for the hook, held until
        # after the cancellation (however long this takes on a loaded machine).
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        let_go.set()  # the hold now ends, after its block was cancelled

    try:
        asyncio.run(asyncio.wait_for(main(), 10))
        assert ended == [True]
        deadline = time.monotonic() + 5
        while sup.held() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert body == [] and sup.held() == []
    finally:
        let_go.set()
        sup.stop()


@pytest.mark.parametrize("bad", ["sup", 5, object()], ids=["str", "int", "object"])
def test_supervise_refuses_a_supervisor_that_is_not_one(store, bad):
    """``supervisor=`` that was not a ``Supervisor`` failed with an ``AttributeError`` about ``owner``
    instead of the ``invalid_run`` every other bad argument of ``supervise`` gives."""
    activate_new(store, "r1", A)
    before = store.runs.get("r1")

    async def main() -> None:
        async with supervise(store, "r1", A, supervisor=bad):
            raise AssertionError("the body ran")

    with pytest.raises(fencepost.RunStoreError) as info:
        asyncio.run(main())
    assert info.value.code == "invalid_run" and "supervisor" in str(info.value)
    assert store.runs.get("r1") == before


@pytest.mark.parametrize("where", ["Supervisor", "LeaseKeeper"])
def test_threaded_supervision_refuses_a_clock_that_is_not_one(store, where):
    """``clock=`` that was not a clock was accepted and failed later with an ``AttributeError``
    about ``now_ms`` (on ``hold``, or on the loop thread)."""
    activate_new(store, "r1", A)
    for bad in ("clock", 5):
        with pytest.raises(fencepost.RunStoreError) as info:
            if where == "Supervisor":
                Supervisor(store, A, clock=bad)
            else:
                LeaseKeeper(store, "r1", A, clock=bad)
        assert info.value.code == "invalid_run" and "clock" in str(info.value)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10", 2**53])
def test_hold_refuses_a_since_ms_that_is_not_a_non_negative_safe_integer_and_holds_nothing(store, bad):
    """``since_ms`` (the lease counted from a reading taken before activating the run) is checked
    before anything is held: a bad value is ``invalid_run`` naming the field, never echoing it."""
    activate_new(store, "r1", A)
    sup = Supervisor(store, A, clock=ManualClock(5_000))
    try:
        with pytest.raises(fencepost.RunStoreError) as info:
            sup.hold("r1", since_ms=bad)
        assert info.value.code == "invalid_run" and "since_ms" in str(info.value)
        assert sup.held() == []
    finally:
        sup.stop()


def test_hold_counts_the_lease_from_since_ms_and_never_from_later_than_now(store):
    """The worker holds a run it has just activated with ``since_ms`` set to a store-clock reading
    taken before the activation, so the lease it supervises can never outlast the one the store
    counts from the activation's heartbeat; a reading later than now counts from now."""
    activate_new(store, "r1", A)
    activate_new(store, "r2", A)
    sup = Supervisor(store, A, clock=ManualClock(5_000))
    try:
        assert sup.hold("r1", since_ms=4_200).confirmed_ms == 4_200
        assert sup.hold("r2", since_ms=9_000).confirmed_ms == 5_000
    finally:
        sup.stop()
