"""A worker rides out a short database outage inside a run: a ``ctx.checkpoint()`` and the settlement
after the function returned retry while the database is unavailable or busy, within the lease's
write budget, instead of handing the function a ``RunStoreError`` (the run then settled ``failed``,
or, when that write failed too, stayed ``running`` until its lease lapsed and a peer ran it again).

Outages are real: another connection holding the write lock past the wait (``busy_timeout_ms``),
and a private PostgreSQL server stopped and
started again (never the shared one). The fencing tests inject failures into ``transition_owned``
with a wrapper, so the lease can be lost at a chosen moment. Each test's docstring says what was wrong.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import fencepost
from fencepost.errors import RunStoreError
from fencepost.runstore.ownership import LeaseLost
from fencepost.worker import Worker
from tests.faults.conftest import private_server  # noqa: F401 - fixture
from tests.runstore.conftest import B
from tests.worker.conftest import (
    Faulty,
    LockHolder,  # noqa: F401 - imported by the projections' outage tests
    assert_write_fails_now,
    checkpoint_retrying,
    outage,  # noqa: F401 - fixture, imported by the journal's outage tests
    run_in_thread,
    short_wait,
    stop_worker,
    unavailable,
    wait_for,
)

BOUND_S = 20  # every wait; the outages last seconds
# How long the lock is held once the run meets it: well past one call's own wait (a call fails once
# ``busy_timeout_ms``, 100 ms here, has passed, on both backends).
OUTAGE_S = {"sqlite": 1.0, "postgresql": 1.0}


# Imported by the journal's and the projections' outage tests.
_short_wait = short_wait


def _run_through_a_short_outage(store, holder, fn, locked: threading.Event) -> tuple[Any, Any]:
    """Run ``fn`` on ``r1``; once it runs, hold the write lock (writes really fail), let ``fn`` go on
    (``locked``) and free the lock after ``OUTAGE_S``. Once the run left ``running``: its row, and
    what the worker's ``run()`` returned when stopped."""
    worker = Worker(store, fn, concurrency=1)
    stop = threading.Event()
    t, outcome = run_in_thread(worker, stop)
    try:
        assert wait_for(lambda: store.runs.get("r1").status == "running", BOUND_S)
        holder.hold()
        assert_write_fails_now(store)
        timer = holder.free_after(OUTAGE_S[holder.backend])
        locked.set()
        assert wait_for(lambda: store.runs.get("r1").status != "running", BOUND_S)
        timer.join()
        row = store.runs.get("r1")
    finally:
        holder.free()
        stop.set()
        t.join(BOUND_S)
    assert outcome, "the worker did not return after stop"
    return row, outcome[0]


def test_a_checkpoint_during_a_short_outage_waits_it_out(outage):  # noqa: F811
    """The checkpoint's write met the held lock past the wait and raised ``RunStoreError`` into the
    function: uncaught, the run settled ``failed`` (or stayed ``running`` until its lease lapsed,
    when that write failed too), though the lock was released moments later."""
    store, holder = outage
    store.runs.create("r1", "{}")
    locked, seen = threading.Event(), []

    def fn(ctx):
        assert locked.wait(BOUND_S)
        try:
            ctx.checkpoint({"step": 1})
        except BaseException as exc:  # the defect: the outage reached the function
            seen.append(exc)
            raise
        seen.append("checkpointed")
        return {"step": 2}

    row, stats = _run_through_a_short_outage(store, holder, fn, locked)
    assert seen == ["checkpointed"], seen
    assert row.status == "completed" and row.state_json == '{"step":2}', (row.status, row.failure)
    assert stats.completed == 1 and stats.failed == 0


def test_settling_after_the_function_returned_waits_out_a_short_outage(outage):  # noqa: F811
    """The function returned its result while the lock was held: the ``completed`` write failed,
    the worker logged "settling a run failed" and the run stayed ``running`` until its lease
    lapsed, then ran again elsewhere; the result was lost."""
    store, holder = outage
    store.runs.create("r1", "{}")
    locked, calls = threading.Event(), []

    def fn(ctx):
        calls.append(ctx.run_id)
        assert locked.wait(BOUND_S)
        return {"answer": 42}

    row, stats = _run_through_a_short_outage(store, holder, fn, locked)
    assert row.status == "completed" and row.state_json == '{"answer":42}'
    assert calls == ["r1"]
    assert stats.completed == 1


@pytest.mark.slow
def test_a_checkpoint_rides_out_a_postgresql_server_restart(private_server):  # noqa: F811
    """With the server down past one call's retry budget (a few seconds), the checkpoint raised
    ``persistence_failed`` into the function and the run could not even be settled ``failed``."""
    store = fencepost.open(private_server.url)
    stop = threading.Event()
    try:
        store.runs.create("r1", "{}")
        down, seen = threading.Event(), []

        def fn(ctx):
            assert down.wait(30)
            ctx.checkpoint({"step": 1})
            seen.append("checkpointed")
            return {"step": 2}

        worker = Worker(store, fn, concurrency=1)
        t, outcome = run_in_thread(worker, stop)
        assert wait_for(lambda: store.runs.get("r1").status == "running", BOUND_S)
        private_server._run("pg_ctl", "-D", str(private_server.data), "-m", "fast", "-w", "stop")
        down.set()
        time.sleep(6)  # past one call's own retries (about 3 s)
        private_server.start()
        assert wait_for(lambda: store.runs.get("r1").status != "running", 15)
        row = store.runs.get("r1")
        assert seen == ["checkpointed"]
        assert row.status == "completed" and row.state_json == '{"step":2}'
        assert stop_worker(t, stop, outcome, BOUND_S).completed == 1
    finally:
        stop.set()
        store.close()


def test_a_retry_never_writes_once_the_lease_is_lost(store, clock):
    """The fence is kept through the retries: the lease is lost while the checkpoint is retrying
    (the run left the owner, a peer took it); no attempt reaches the store after that, the function
    sees ``LeaseLost``, and the peer's run is untouched."""
    store.runs.create("r1", '{"v":0}')
    faulty = Faulty(store)
    go, seen = threading.Event(), []

    def fn(ctx):
        assert go.wait(BOUND_S)
        try:
            ctx.checkpoint({"v": 1})
        except BaseException as exc:
            seen.append(exc)
            raise
        seen.append("checkpointed")

    worker = Worker(store, fn, concurrency=1)
    stop = threading.Event()
    t, outcome = run_in_thread(worker, stop)
    try:
        assert wait_for(lambda: store.runs.get("r1").status == "running", BOUND_S)
        faulty.down.set()
        go.set()
        assert wait_for(lambda: faulty.failed >= 2 or bool(seen), BOUND_S), seen  # retrying, not raised
        assert not seen, seen
        # The run leaves this worker (an operator parks it), a peer takes it; the next pulse
        # answers FenceLost and the lease is lost.
        faulty.real("r1", worker.owner, "suspended")
        row = store.runs.get("r1")
        claimed = store.runs.claim("r1", row.snapshot(), B, clock.now_ms())
        assert type(store.runs.activate("r1", B, claimed.claimed_at_ms, row.snapshot())).__name__ == "Activated"
        clock.advance(1000)
        assert wait_for(lambda: bool(seen), BOUND_S)
        faulty.down.clear()  # the database answers again: nothing may be written now
        time.sleep(0.3)
        assert isinstance(seen[0], LeaseLost), seen
        assert [c for c in faulty.reached if c[0] == "r1"] == [], faulty.reached
        row = store.runs.get("r1")
        assert row.owner == B and row.status == "running" and row.state_json == '{"v":0}'
    finally:
        faulty.down.clear()
        stop.set()
        t.join(BOUND_S)
    assert outcome and outcome[0].lost == 1


@pytest.mark.parametrize("kind", ["disk_full", "bad_input"])
def test_only_an_unavailable_or_busy_database_is_retried(store, kind):
    """Regression guard: a failure that waiting cannot cure (a full disk; a refused argument) reaches
    the function at once, after one attempt."""
    store.runs.create("r1", "{}")
    if kind == "disk_full":
        error = RunStoreError("persistence_failed", "transition_owned", "run persistence failed")
        error.db_code = "SQLITE_FULL"  # type: ignore[attr-defined]
        error.transient = False  # type: ignore[attr-defined]
    else:
        error = RunStoreError("invalid_run", "transition_owned", "state_json is too large")
    faulty = Faulty(store, error)
    seen: list = []

    def fn(ctx):
        faulty.down.set()
        started = time.monotonic()
        try:
            ctx.checkpoint({"v": 1})
        except RunStoreError as exc:
            seen.append((exc.code, time.monotonic() - started, faulty.failed))
        faulty.down.clear()

    worker = Worker(store, fn, concurrency=1)
    worker.run(until_idle=True)
    assert len(seen) == 1 and seen[0][0] == error.code and seen[0][2] == 1 and seen[0][1] < 1.0, seen
    assert store.runs.get("r1").status == "completed"


def test_a_settlement_whose_commit_answer_was_lost_but_landed_counts_as_completed(store):
    """A settlement retried after a COMMIT that got no answer may have landed the first time; the
    retry then finds the run no longer this owner's. The worker reads the row: the settlement it
    wrote is there, so the run counts as completed, not as a lost lease."""
    from fencepost._durable import COMMIT_UNKNOWN

    store.runs.create("r1", "{}")
    real = store.runs.transition_owned
    attempts: list[str] = []

    def lands_then_fails(run_id, owner, to, *args, **kwargs):
        attempts.append(to)
        outcome = real(run_id, owner, to, *args, **kwargs)
        if len(attempts) == 1:
            raise unavailable("transition_owned", "08006", f"run persistence failed: {COMMIT_UNKNOWN}")
        return outcome

    store.runs.transition_owned = lands_then_fails
    stats = Worker(store, lambda ctx: {"done": True}, concurrency=1).run(until_idle=True)
    assert attempts == ["completed", "completed"]
    row = store.runs.get("r1")
    assert row.status == "completed" and row.state_json == '{"done":true}'
    assert (stats.completed, stats.lost) == (1, 0)


def test_an_outage_longer_than_the_lease_budget_is_given_up_on(store, clock):
    """Bounded: the retries end at the lease's deadline (19 s on the store's clock after the last
    confirmed heartbeat); the function then gets the ``RunStoreError``."""
    store.runs.create("r1", "{}")
    with checkpoint_retrying(store, BOUND_S) as retrying:
        assert not retrying.seen
        clock.advance(19_000)
        assert wait_for(lambda: bool(retrying.seen), BOUND_S)
        assert isinstance(retrying.seen[0], (RunStoreError, LeaseLost)), retrying.seen
        assert retrying.faulty.reached == []


def test_a_closed_store_error_is_not_transient(db_url):
    """Regression guard: the flag says only what waiting may cure; a closed store never comes back."""
    store = fencepost.open(db_url)
    store.close()
    with pytest.raises(RunStoreError) as info:
        store.runs.create("r1", "{}")
    assert info.value.db_code == "closed" and info.value.transient is False  # type: ignore[attr-defined]
