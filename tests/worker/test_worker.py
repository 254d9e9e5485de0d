"""The worker: sweep, two-phase claim, takeover of expired leases, checkpoints, cancellation, settling,
and several workers sharing one database. Every test runs on SQLite and PostgreSQL; time is a
``ManualClock`` (leases expire because the test moves the clock, never by waiting)."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import msgspec
import pytest

import fencepost
from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Claimed, FenceLost
from fencepost.runstore.rows import LivenessEvidence
from fencepost.worker import Cancelled, RunContext, Suspend, Worker
from tests.worker.conftest import facts, own

DEAD = OwnerId("host-gone", 999_999, "dead-owner")


def _json(value) -> str:
    return msgspec.json.encode(value).decode()


def _create(store, n: int, prefix: str = "r", state=None) -> list[str]:
    ids = [f"{prefix}{i:03d}" for i in range(n)]
    for run_id in ids:
        store.runs.create(run_id, _json(state if state is not None else {"n": run_id}))
    return ids


def _run_with_every_pulse_fence_lost(store, worker: Worker) -> tuple[threading.Thread, object]:
    """Start ``worker.run(until_idle=True)`` on a thread while every pulse answers ``FenceLost``:
    the thread, and the real ``runs.heartbeat`` to put back."""
    real = store.runs.heartbeat
    store.runs.heartbeat = lambda run_id, owner, now_ms: FenceLost()
    t = threading.Thread(target=worker.run, kwargs={"until_idle": True})
    t.start()
    return t, real


def _wait_for(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def _renewed(store, run_ids: list[str], now_ms: int, supervisor) -> None:
    """The clock was just set to ``now_ms``: wait until every run's heartbeat is ``now_ms``, then
    until the supervisor has taken in that pulse's answer.

    ``settle()`` alone stops waiting for a pulse in flight after a short grace (it takes it for
    hung); on a loaded machine the heartbeat write can take longer, and a clock moved on before the
    loop took the answer in would put the next pulse one interval after the new reading."""
    _wait_for(lambda: [store.runs.get(r).heartbeat_at_ms for r in run_ids] == [now_ms] * len(run_ids))
    supervisor.settle()


def test_worker_completes_pending_runs_with_the_two_phase_claim(store):
    ids = _create(store, 5)

    def fn(ctx: RunContext):
        return {"done": ctx.run_id}

    stats = Worker(store, fn, concurrency=2).run(until_idle=True)
    assert stats.completed == 5 and stats.claimed == 5 and stats.takeovers == 0
    for run_id in ids:
        row = store.runs.get(run_id)
        assert row.status == "completed"
        assert msgspec.json.decode(row.state_json) == {"done": run_id}
        assert row.owner is None and row.heartbeat_at_ms is None
        assert facts(store, run_id) == ["claimed", "activated", "released"]


def test_checkpoints_are_guarded_running_transitions_and_none_keeps_the_last_state(store):
    _create(store, 1, state={"step": 0})
    seen: list[str] = []

    def fn(ctx: RunContext):
        for step in (1, 2, 3):
            ctx.checkpoint({"step": step})
            seen.append(store.runs.get(ctx.run_id).state_json)
        return None

    Worker(store, fn).run(until_idle=True)
    assert [msgspec.json.decode(s) for s in seen] == [{"step": 1}, {"step": 2}, {"step": 3}]
    row = store.runs.get("r000")
    assert row.status == "completed" and msgspec.json.decode(row.state_json) == {"step": 3}


def test_a_failing_function_settles_failed_and_suspend_parks_the_run(store):
    store.runs.create("boom", "{}")
    store.runs.create("park", "{}")
    parked = threading.Event()

    def fn(ctx: RunContext):
        if ctx.run_id == "boom":
            raise ValueError("nope")
        if not parked.is_set():
            parked.set()
            raise Suspend({"parked": True})
        return {"resumed": True}

    worker = Worker(store, fn)
    stats = worker.run(until_idle=True)
    assert store.runs.get("boom").status == "failed"
    # The suspended run is claimable again, so the same sweep loop resumed and completed it.
    row = store.runs.get("park")
    assert row.status == "completed" and msgspec.json.decode(row.state_json) == {"resumed": True}
    assert stats.failed == 1 and stats.suspended == 1 and stats.completed == 1


def test_cancel_requested_before_the_claim_settles_cancelled_without_running(store):
    _create(store, 1)
    store.runs.request_cancel("r000", 0)
    ran: list[str] = []
    stats = Worker(store, lambda ctx: ran.append(ctx.run_id)).run(until_idle=True)
    row = store.runs.get("r000")
    assert ran == [] and stats.cancelled == 1
    assert row.status == "cancelled"
    assert row.cancel_acknowledgement is not None


def test_cancel_during_the_run_is_acknowledged_within_an_interval_then_settled(store, clock, db_url):
    """EO-10: the live owner acknowledges within one heartbeat interval, before its cleanup ends;
    after the cleanup the run is cancelled, and the acknowledgement survives reopening the store."""
    _create(store, 1)
    started = threading.Event()
    cleanup = threading.Event()
    observed: list[object] = []

    def fn(ctx: RunContext):
        started.set()
        try:
            while True:
                ctx.check()
                time.sleep(0.005)
        except Cancelled:
            cleanup.wait(10)
            observed.append(store.runs.get(ctx.run_id))
            raise

    worker = Worker(store, fn)
    t = threading.Thread(target=worker.run, kwargs={"until_idle": True})
    t.start()
    assert started.wait(10)
    requested_at = clock.now_ms()
    store.runs.request_cancel("r000", requested_at)
    clock.advance(1000)
    _wait_for(lambda: store.runs.get("r000").cancel_acknowledgement is not None)
    row = store.runs.get("r000")
    assert row.status == "running" and row.owner == worker.owner
    owner = {"hostId": worker.owner.host_id, "pid": worker.owner.pid, "nonce": worker.owner.nonce}
    ack = row.cancel_acknowledgement
    assert ack["owner"] == owner and requested_at <= ack["observedAtMs"] <= requested_at + 1000
    cleanup.set()
    t.join(10)
    assert store.runs.get("r000").status == "cancelled"
    assert observed and observed[0].status == "running" and observed[0].cancel_acknowledgement == ack
    with fencepost.open(db_url, clock=clock) as reopened:
        again = reopened.runs.get("r000")
    assert (again.status, again.cancel_requested_at_ms, again.cancel_acknowledgement) == (
        "cancelled", requested_at, ack)


def test_a_checkpoint_after_a_cancel_request_raises_cancelled_and_settles_cancelled(store, clock):
    _create(store, 1)

    def fn(ctx: RunContext):
        store.runs.request_cancel(ctx.run_id, clock.now_ms())
        ctx.checkpoint({"late": True})  # refused by the absent guard
        return {"never": True}

    stats = Worker(store, fn).run(until_idle=True)
    row = store.runs.get("r000")
    assert row.status == "cancelled" and stats.cancelled == 1
    assert "late" not in row.state_json


def test_completion_racing_a_cancel_request_settles_cancelled(store, clock):
    _create(store, 1)

    def fn(ctx: RunContext):
        store.runs.request_cancel(ctx.run_id, clock.now_ms())
        return {"finished": True}  # the completed transition meets the absent guard and fails

    Worker(store, fn).run(until_idle=True)
    assert store.runs.get("r000").status == "cancelled"


def test_expired_lease_of_a_dead_owner_is_stolen_with_evidence_and_resumed(store, clock):
    _create(store, 1, state={"done": 1})
    own(store, "r000", DEAD)
    resumed: list[object] = []

    def fn(ctx: RunContext):
        resumed.append(ctx.state)
        return {"done": 2}

    clock.set(30_000)  # exactly 30 s old: still fresh, nobody may take it
    worker = Worker(store, fn)
    assert worker.take(1) == []
    clock.set(30_001)
    stats = worker.run(until_idle=True)
    assert stats.takeovers == 1 and resumed == [{"done": 1}]
    assert store.runs.get("r000").status == "completed"
    assert facts(store, "r000") == ["claimed", "activated", "stolen", "activated", "released"]


def test_a_live_owner_is_not_stolen_when_the_liveness_check_says_alive(store, clock):
    _create(store, 1)
    own(store, "r000", DEAD)
    clock.set(40_000)
    worker = Worker(store, lambda ctx: None, liveness=lambda owner, context: True)
    assert worker.take(5) == []
    assert store.runs.get("r000").owner == DEAD


def test_a_claim_left_by_a_dead_claimant_is_recovered_then_taken(store, clock):
    _create(store, 1)
    row = store.runs.get("r000")
    assert isinstance(store.runs.claim("r000", row.snapshot(), DEAD, 0), Claimed)
    clock.set(30_001)
    stats = Worker(store, lambda ctx: {"ok": 1}).run(until_idle=True)
    assert stats.recovered_claims == 1 and stats.completed == 1
    assert store.runs.get("r000").status == "completed"


def test_held_runs_are_renewed_together_by_one_heartbeat_many(store, clock):
    _create(store, 3)
    release = threading.Event()
    running = Counter()

    def fn(ctx: RunContext):
        running[ctx.run_id] += 1
        release.wait(10)
        return None

    worker = Worker(store, fn, concurrency=3)
    calls: list[int] = []
    real = store.runs.heartbeat_many

    def counting(owner, run_ids, now_ms):
        calls.append(len(list(run_ids)))
        return real(owner, run_ids, now_ms)

    store.runs.heartbeat_many = counting
    t = threading.Thread(target=worker.run, kwargs={"until_idle": True})
    t.start()
    def renewed_at(now_ms: int) -> None:
        clock.set(now_ms)
        _renewed(store, sorted(running), now_ms, worker.supervisor)

    try:
        _wait_for(lambda: len(running) == 3)
        renewed_at(1000)
        renewed_at(2000)
        assert calls and all(n == 3 for n in calls)
    finally:
        release.set()
        t.join(10)


def test_a_worker_run_again_after_it_returned_still_renews_its_leases(store, clock):
    """A ``Worker`` whose ``run()`` had returned (``until_idle``, or ``stop`` set) and was run again
    never renewed a lease in the second run: its supervisor's thread had stopped and ``start()``
    saw a thread object and did nothing, so after 30 s a peer could take over a run still running.
    The second run renews its leases like the first."""
    _create(store, 1, prefix="first")
    worker = Worker(store, lambda ctx: {"ok": True})
    assert worker.run(until_idle=True).completed == 1

    _create(store, 1, prefix="second")
    inside, release = threading.Event(), threading.Event()

    def fn(ctx: RunContext):
        inside.set()
        release.wait(10)
        return {"ok": True}

    worker.fn = fn
    t = threading.Thread(target=worker.run, kwargs={"until_idle": True})
    t.start()
    try:
        assert inside.wait(10)
        clock.set(1000)
        _renewed(store, ["second000"], 1000, worker.supervisor)
        clock.set(2000)
        _renewed(store, ["second000"], 2000, worker.supervisor)
    finally:
        release.set()
        t.join(10)
    assert not t.is_alive()
    assert store.runs.get("second000").status == "completed" and worker.stats.completed == 2


@pytest.mark.slow
def test_several_workers_on_one_database_run_each_run_exactly_once(db_url, clock):
    """EO-03: a race as a race: four workers, each with its own store (own connections), start at a
    barrier; every run's function runs exactly once and the run completes."""
    n_runs, n_workers = 40, 4
    with fencepost.open(db_url, clock=clock) as setup:
        _create(setup, n_runs)
    executions: Counter = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(n_workers)

    def fn(ctx: RunContext):
        with lock:
            executions[ctx.run_id] += 1
        time.sleep(0.002)
        return {"by": ctx.owner.nonce}

    def work(i: int) -> None:
        with fencepost.open(db_url, clock=clock) as s:
            w = Worker(s, fn, owner=OwnerId("host-a", 1000 + i, f"w{i}"), concurrency=3)
            barrier.wait()
            w.run(until_idle=True)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(executions.values()) == n_runs and set(executions.values()) == {1}
    with fencepost.open(db_url, clock=clock) as check:
        rows = [check.runs.get(f"r{i:03d}") for i in range(n_runs)]
        assert {r.status for r in rows} == {"completed"}
        winners = {msgspec.json.decode(r.state_json)["by"] for r in rows}
        assert len(winners) > 1  # the work really was shared
        for r in rows:
            assert facts(check, r.run_id) == ["claimed", "activated", "released"]


def test_steal_refuses_evidence_for_another_owner(store, clock):
    """OW-07 through the worker's own evidence: it always names the owner it read."""
    _create(store, 1)
    own(store, "r000", DEAD)
    clock.set(30_001)
    row = store.runs.get("r000")
    wrong = LivenessEvidence(OwnerId("host-b", 1, "x"), 30_001, "lease-expired")
    assert type(store.runs.steal("r000", row, OwnerId("host-c", 2, "y"), 30_001, wrong)).__name__ == \
        "LivenessUnconfirmed"


def test_a_lost_fence_stops_the_function_and_the_worker_does_not_settle(store, clock):
    """EO-08 for the worker: the pulse answers FenceLost, ``check()`` raises LeaseLost, nothing is settled;
    once the abandoned lease expires the run is taken over (here by the same worker) and finished."""
    _create(store, 1)
    inside = threading.Event()
    stopped: list[str] = []

    def fn(ctx: RunContext):
        if stopped:
            return {"second": True}
        inside.set()
        try:
            while True:
                ctx.check()
                time.sleep(0.005)
        except Exception as exc:
            stopped.append(type(exc).__name__)
            raise

    worker = Worker(store, fn)
    t, real = _run_with_every_pulse_fence_lost(store, worker)
    try:
        assert inside.wait(10)
        clock.set(1000)
        _wait_for(lambda: stopped == ["LeaseLost"])
        row = store.runs.get("r000")
        assert row.status == "running" and row.owner == worker.owner  # left to whoever holds the fence
        store.runs.heartbeat = real
        clock.set(31_001)  # the abandoned lease expires
    finally:
        t.join(20)
    assert not t.is_alive()
    assert worker.stats.lost == 1 and worker.stats.takeovers == 1
    assert store.runs.get("r000").status == "completed"


def test_stopping_the_worker_parks_runs_in_hand_as_suspended_from_their_checkpoint(store):
    _create(store, 1, state={"step": 0})
    inside = threading.Event()

    def fn(ctx: RunContext):
        ctx.checkpoint({"step": 1})
        inside.set()
        while True:
            ctx.check()
            time.sleep(0.005)

    worker = Worker(store, fn)
    stop = threading.Event()
    t = threading.Thread(target=worker.run, args=(stop,))
    t.start()
    assert inside.wait(10)
    stop.set()
    t.join(10)
    assert not t.is_alive()
    row = store.runs.get("r000")
    assert row.status == "suspended" and msgspec.json.decode(row.state_json) == {"step": 1}
    assert row.owner is None and worker.stats.suspended == 1


def test_pid_probe_liveness_takes_over_a_dead_same_host_owner_and_spares_a_live_one(store, clock):
    import subprocess
    import sys

    from fencepost.runstore.liveness import same_host_pid_probe

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now
    me = OwnerId("host-z", 4242, "worker")
    _create(store, 2)
    own(store, "r000", OwnerId("host-z", child.pid, "dead"))
    own(store, "r001", OwnerId("host-z", os.getpid(), "alive"))  # this very process: alive
    clock.set(30_001)
    worker = Worker(store, lambda ctx: {"ok": True}, owner=me, liveness=same_host_pid_probe)
    taken = worker.take(5)
    assert [r.run_id for r in taken] == ["r000"]
    assert store.runs.get("r001").owner.nonce == "alive"
    assert facts(store, "r000")[-2:] == ["stolen", "activated"]


def test_a_run_that_suspends_itself_is_not_taken_again_at_once(store):
    """A run function that raised ``Suspend`` had its run taken again by the same worker at once: a
    run that keeps suspending (waiting for something outside) was claimed, activated and released
    about 170 times a second, three journal entries each, the journal growing without bound. The
    worker now leaves a run it suspended for ``SUSPEND_BACKOFF_S`` before taking it again (other
    runs meanwhile), and ``until_idle`` still waits for it."""
    import itertools
    import time

    from fencepost.worker import SUSPEND_BACKOFF_S

    store.runs.create("waits", "{}")
    store.runs.create("other", "{}")
    calls: list[tuple[str, float]] = []

    def fn(ctx: RunContext):
        calls.append((ctx.run_id, time.monotonic()))
        if ctx.run_id == "waits" and sum(1 for r, _ in calls if r == "waits") < 3:
            raise Suspend({"tries": len(calls)})
        return {"done": True}

    stats = Worker(store, fn).run(until_idle=True)
    waits = [t for r, t in calls if r == "waits"]
    assert len(waits) == 3 and stats.suspended == 2 and stats.completed == 2
    assert all(b - a >= SUSPEND_BACKOFF_S * 0.9 for a, b in itertools.pairwise(waits)), waits
    assert store.runs.get("waits").status == "completed" and store.runs.get("other").status == "completed"
    # The other run was not held back by the one resting.
    assert [r for r, _ in calls].index("other") < 3


def test_a_run_suspended_while_the_sweep_reads_is_left_to_rest(store):
    """The sweep asked which runs rest before it read the candidates: a run suspended by another of
    this worker's threads between the two (its rest begun, then settled ``suspended``) was read as
    claimable and taken back at once, the rest skipped (seen as a flaky rest test). The resting
    runs are now asked after the read."""
    import time

    store.runs.create("waits", "{}")
    store.runs.create("other", "{}")
    worker = Worker(store, lambda ctx: {"ok": True})
    read = worker._candidates

    def read_while_a_run_suspends(limit, **kw):
        found = read(limit, **kw)
        # What the run thread does between the sweep's two questions: its rest begins.
        with worker._lock:
            worker._resting["waits"] = time.monotonic() + 60
        return found

    worker._candidates = read_while_a_run_suspends
    taken = worker.take(5)
    assert [r.run_id for r in taken] == ["other"]
    assert store.runs.get("waits").status == "pending"


def test_a_run_still_in_hand_after_its_lease_was_lost_is_not_taken_again_by_the_same_worker(store, clock):
    """A run whose lease this worker lost, while its function was still running (it had not reached
    ``check()`` yet), was taken over again by the same worker once the lease expired: a second
    execution of the run started beside the first, in the same process, and the first one's future
    was forgotten (the pool slot it held no longer counted)."""
    _create(store, 1)
    inside = threading.Event()
    release = threading.Event()
    lock = threading.Lock()
    running = [0]
    peak = [0]
    calls: list[int] = []

    def fn(ctx: RunContext):
        with lock:
            calls.append(1)
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            if len(calls) == 1:
                inside.set()
                release.wait(20)  # busy with one long unit of work: no check() meanwhile
                ctx.check()
            return {"second": True}
        finally:
            with lock:
                running[0] -= 1

    worker = Worker(store, fn)
    sweeps_after_expiry: list[int] = []
    real_sweep = worker._sweep

    def counting_sweep(limit: int, start=None, **options):
        if clock.now_ms() >= 31_001:
            sweeps_after_expiry.append(1)
        return real_sweep(limit, start, **options)

    worker._sweep = counting_sweep
    t, real = _run_with_every_pulse_fence_lost(store, worker)
    try:
        assert inside.wait(10)
        clock.set(1000)
        _wait_for(lambda: worker.supervisor.held() == [])  # the lease is lost; the function goes on
        store.runs.heartbeat = real
        clock.set(31_001)  # the lost lease expires: the run is claimable by anyone but its holder
        _wait_for(lambda: len(sweeps_after_expiry) >= 3)
        assert len(calls) == 1, "the run was started again while its first execution was in hand"
    finally:
        release.set()
        t.join(20)
    assert not t.is_alive()
    assert peak[0] == 1 and len(calls) == 2
    assert worker.stats.lost == 1 and worker.stats.takeovers == 1
    assert store.runs.get("r000").status == "completed"


def test_every_exception_a_run_function_meets_is_exported_by_the_worker_module():
    """``RunContext.check()`` raises ``LeaseLost``, and the worker guide's table tells a run function
    what happens when it raises it, yet ``fencepost.worker.__all__`` left it out: ``help()`` on the
    module did not show it and ``from fencepost.worker import *`` did not bring it. Every exception
    a run function sees or raises is exported now, the same class the ownership module raises. No
    database is involved, so one run covers both backends."""
    import pydoc

    import fencepost.worker as worker
    from fencepost.runstore import ownership

    for name in ("Cancelled", "LeaseLost", "Stopping", "Suspend", "UnstorableResult"):
        assert name in worker.__all__
        assert f"class {name}" in pydoc.render_doc(worker, renderer=pydoc.plaintext)
    assert worker.LeaseLost is ownership.LeaseLost


def test_a_run_suspended_by_one_worker_is_taken_by_another_at_once(store):
    """A carried question: a suspended run is claimable again at once by any worker but the one
    that suspended it (which rests it for ``SUSPEND_BACKOFF_S``). The seeds define ``suspended``
    as parked and claimable again with no waiting period, so a second worker takes it without the
    clock moving; only the suspending worker holds back."""
    store.runs.create("parked", "{}")
    stop = threading.Event()

    def suspend_and_stop(ctx: RunContext):
        stop.set()  # no further sweep: the run settles suspended and run() returns
        raise Suspend({"step": 1})

    first = Worker(store, suspend_and_stop, owner=OwnerId("host-a", 1, "first"))
    first.run(stop)
    assert store.runs.get("parked").status == "suspended"
    assert first.take(1) == []  # the worker that suspended it rests it
    second = Worker(store, lambda ctx: {"ok": True}, owner=OwnerId("host-b", 2, "second"))
    taken = second.take(1)
    assert [r.run_id for r in taken] == ["parked"]
    row = store.runs.get("parked")
    assert (row.status, row.owner.nonce) == ("running", "second")
    assert facts(store, "parked")[-3:] == ["released", "claimed", "activated"]
