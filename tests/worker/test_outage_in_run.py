"""A worker rides out a short database outage inside a run: a ``ctx.checkpoint()`` and the settlement
after the function returned retry while the database is unavailable or busy, within the lease's
write budget, instead of handing the function a ``RunStoreError`` (the run then settled ``failed``,
or, when that write failed too, stayed ``running`` until its lease lapsed and a peer ran it again).

Outages are real: another connection holding the write lock past the wait (SQLite's
``busy_timeout_ms``, PostgreSQL's ``lock_timeout``), and a private PostgreSQL server stopped and
started again (never the shared one). The fencing tests inject failures into ``transition_owned``
with a wrapper, so the lease can be lost at a chosen moment. Each test's docstring says what was wrong.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import fencepost
from fencepost.errors import RunStoreError
from fencepost.runstore.ownership import LeaseLost
from fencepost.worker import Worker
from tests.faults.conftest import private_server  # noqa: F401 - fixture
from tests.runstore.conftest import B
from tests.worker.test_database_outage import _run_in_thread, _wait_for

BOUND_S = 20  # every wait; the outages last seconds
# How long the lock is held once the run meets it: past one call's own retries (SQLite answers busy
# once ``busy_timeout_ms`` has passed; PostgreSQL retries a lock timeout for about 4 s).
OUTAGE_S = {"sqlite": 1.0, "postgresql": 6.0}


def _short_wait(url: str, backend: str) -> str:
    """``url`` with a 100 ms wait for another writer's lock (the store's own retries still apply)."""
    sep = "&" if "?" in url else "?"
    if backend == "sqlite":
        return f"{url}{sep}busy_timeout_ms=100"
    return f"{url}{sep}options=-c%20lock_timeout%3D100"


class LockHolder:
    """Another connection holding the store's write lock (SQLite ``BEGIN IMMEDIATE``; PostgreSQL the
    per-schema advisory write lock every write transaction takes first)."""

    def __init__(self, url: str, backend: str) -> None:
        self.backend = backend
        if backend == "sqlite":
            self.conn: Any = sqlite3.connect(url[len("sqlite:///"):], isolation_level=None,
                                              check_same_thread=False)
        else:
            self.schema = url.rsplit("schema=", 1)[1]
            self.engine = create_engine(url.rsplit("?", 1)[0], poolclass=NullPool)
            self.conn = None
        self.held = False

    def hold(self) -> None:
        if self.backend == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            self.conn = self.engine.connect()
            self.conn.exec_driver_sql(
                f"SELECT pg_advisory_xact_lock(hashtextextended('{self.schema}', 2099))")
        self.held = True

    def free(self) -> None:
        if not self.held:
            return
        self.held = False
        if self.backend == "sqlite":
            self.conn.execute("ROLLBACK")
        else:
            self.conn.rollback()
            self.conn.close()

    def free_after(self, seconds: float) -> threading.Timer:
        timer = threading.Timer(seconds, self.free)
        timer.start()
        return timer

    def close(self) -> None:
        self.free()
        if self.backend == "sqlite":
            self.conn.close()
        else:
            self.engine.dispose()


@pytest.fixture
def outage(db_url: str, backend: str):
    """``(store, holder)``: a store that waits 100 ms for a lock, and a holder of its write lock."""
    store = fencepost.open(_short_wait(db_url, backend))
    holder = LockHolder(db_url, backend)
    try:
        yield store, holder
    finally:
        holder.close()
        store.close()


def _assert_write_fails_now(store) -> None:
    """The holder really makes writes fail (the outage is real, not a slow write)."""
    with pytest.raises(RunStoreError) as info:
        store.runs.create("probe", "{}")
    assert info.value.code == "persistence_failed"
    assert info.value.transient is True  # type: ignore[attr-defined] - waiting may cure it


def test_a_checkpoint_during_a_short_outage_waits_it_out(outage):
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

    worker = Worker(store, fn, concurrency=1)
    stop = threading.Event()
    t, outcome = _run_in_thread(worker, stop)
    try:
        assert _wait_for(lambda: store.runs.get("r1").status == "running", BOUND_S)
        holder.hold()
        _assert_write_fails_now(store)
        timer = holder.free_after(OUTAGE_S[holder.backend])
        locked.set()
        assert _wait_for(lambda: store.runs.get("r1").status != "running", BOUND_S)
        timer.join()
        row = store.runs.get("r1")
        assert seen == ["checkpointed"], seen
        assert row.status == "completed" and row.state_json == '{"step":2}', (row.status, row.failure)
    finally:
        holder.free()
        stop.set()
        t.join(BOUND_S)
    assert outcome and outcome[0].completed == 1 and outcome[0].failed == 0


def test_settling_after_the_function_returned_waits_out_a_short_outage(outage):
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

    worker = Worker(store, fn, concurrency=1)
    stop = threading.Event()
    t, outcome = _run_in_thread(worker, stop)
    try:
        assert _wait_for(lambda: store.runs.get("r1").status == "running", BOUND_S)
        holder.hold()
        _assert_write_fails_now(store)
        timer = holder.free_after(OUTAGE_S[holder.backend])
        locked.set()
        assert _wait_for(lambda: store.runs.get("r1").status != "running", BOUND_S)
        timer.join()
        row = store.runs.get("r1")
        assert row.status == "completed" and row.state_json == '{"answer":42}'
        assert calls == ["r1"]
    finally:
        holder.free()
        stop.set()
        t.join(BOUND_S)
    assert outcome and outcome[0].completed == 1


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
        t, outcome = _run_in_thread(worker, stop)
        assert _wait_for(lambda: store.runs.get("r1").status == "running", BOUND_S)
        private_server._run("pg_ctl", "-D", str(private_server.data), "-m", "fast", "-w", "stop")
        down.set()
        time.sleep(6)  # past one call's own retries (about 3 s)
        private_server.start()
        assert _wait_for(lambda: store.runs.get("r1").status != "running", 15)
        row = store.runs.get("r1")
        assert seen == ["checkpointed"]
        assert row.status == "completed" and row.state_json == '{"step":2}'
        stop.set()
        t.join(BOUND_S)
        assert outcome and outcome[0].completed == 1
    finally:
        stop.set()
        store.close()


class Faulty:
    """Wraps ``store.runs.transition_owned``: raises a transient (or given) database error while
    ``down`` is set, and records every call that reached the real store."""

    def __init__(self, store, error: RunStoreError | None = None) -> None:
        self.real = store.runs.transition_owned
        self.down = threading.Event()
        self.failed = 0
        self.reached: list[tuple[str, str]] = []
        self.error = error
        store.runs.transition_owned = self  # instance attribute: only this store is affected

    def __call__(self, run_id, owner, to, *args, **kwargs):
        if self.down.is_set():
            self.failed += 1
            if self.error is not None:
                raise self.error
            err = RunStoreError("persistence_failed", "transition_owned", "run persistence failed")
            err.db_code = "SQLITE_BUSY"  # type: ignore[attr-defined]
            err.transient = True  # type: ignore[attr-defined]
            raise err
        self.reached.append((run_id, to))
        return self.real(run_id, owner, to, *args, **kwargs)


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
    t, outcome = _run_in_thread(worker, stop)
    try:
        assert _wait_for(lambda: store.runs.get("r1").status == "running", BOUND_S)
        faulty.down.set()
        go.set()
        assert _wait_for(lambda: faulty.failed >= 2 or bool(seen), BOUND_S), seen  # retrying, not raised
        assert not seen, seen
        # The run leaves this worker (an operator parks it), a peer takes it; the next pulse
        # answers FenceLost and the lease is lost.
        faulty.real("r1", worker.owner, "suspended")
        row = store.runs.get("r1")
        claimed = store.runs.claim("r1", row.snapshot(), B, clock.now_ms())
        assert type(store.runs.activate("r1", B, claimed.claimed_at_ms, row.snapshot())).__name__ == "Activated"
        clock.advance(1000)
        assert _wait_for(lambda: bool(seen), BOUND_S)
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
            err = RunStoreError("persistence_failed", "transition_owned", f"run persistence failed: {COMMIT_UNKNOWN}")
            err.db_code = "08006"  # type: ignore[attr-defined]
            err.transient = True  # type: ignore[attr-defined]
            raise err
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
    faulty = Faulty(store)
    seen: list = []

    def fn(ctx):
        faulty.down.set()
        try:
            ctx.checkpoint({"v": 1})
        except BaseException as exc:
            seen.append(exc)
            raise

    worker = Worker(store, fn, concurrency=1)
    stop = threading.Event()
    t, _outcome = _run_in_thread(worker, stop)
    try:
        assert _wait_for(lambda: faulty.failed >= 2, BOUND_S)
        assert not seen
        clock.advance(19_000)
        assert _wait_for(lambda: bool(seen), BOUND_S)
        assert isinstance(seen[0], (RunStoreError, LeaseLost)), seen
        assert faulty.reached == []
    finally:
        faulty.down.clear()
        stop.set()
        t.join(BOUND_S)


def test_a_closed_store_error_is_not_transient(db_url):
    """Regression guard: the flag says only what waiting may cure; a closed store never comes back."""
    store = fencepost.open(db_url)
    store.close()
    with pytest.raises(RunStoreError) as info:
        store.runs.create("r1", "{}")
    assert info.value.db_code == "closed" and info.value.transient is False  # type: ignore[attr-defined]
