"""A sweep that fails partway never strands the runs it already took.

``Worker.take`` claims and activates runs one by one; when a later step of the sweep failed (the
database went away after some runs were activated), the exception left ``take`` and the rows already
taken with it: those runs sat ``running`` under a lease nobody renewed, until it expired (30 s) and
a peer (or this worker) took them over. The failure is injected deterministically at the N-th call
of a store method (both backends, real store otherwise). Each test's docstring says what was wrong.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import fencepost
from fencepost.errors import RunStoreError
from fencepost.runstore.heartbeat import WRITE_TOLERANCE_MS as TOLERANCE_MS
from fencepost.runstore.ownership import LeaseLost
from fencepost.worker import Worker
from tests.worker.conftest import FailAt, run_in_thread, stop_worker, unavailable, wait_for

BOUND_S = 5  # far below the 30 s a stranded run waited for its lease to expire
# A wait through a held write lock: a few calls (each waits ``busy_timeout_ms``, 100 ms here), and
# well below the claim's 19 s budget, which the run already taken used to wait out.
OUTAGE_BOUND_S = 15


def _worker_thread_of(fault: FailAt, worker, stop):
    """Start ``worker.run(stop)`` on a thread that ``fault`` watches."""
    started = threading.Event()
    orig = worker.run

    def run(stop_event):
        fault.thread = threading.current_thread()
        started.set()
        return orig(stop_event)

    worker.run = run
    t, outcome = run_in_thread(worker, stop)
    assert started.wait(BOUND_S)
    return t, outcome


def test_runs_activated_before_a_claim_fails_are_run_at_once(db_url):
    """The second claim of a sweep failed: the first run, already activated, was dropped with the
    exception and stayed ``running`` unheld until its lease expired."""
    store = fencepost.open(db_url)
    stop = threading.Event()
    try:
        for r in ("r1", "r2", "r3"):
            store.runs.create(r, "{}")
        fault = FailAt(store, "claim", {2})
        ran: list[str] = []
        worker = Worker(store, lambda ctx: ran.append(ctx.run_id), concurrency=3)
        t, outcome = _worker_thread_of(fault, worker, stop)
        assert wait_for(lambda: all(store.runs.get(r).status == "completed" for r in ("r1", "r2", "r3")),
                         BOUND_S), [store.runs.get(r).status for r in ("r1", "r2", "r3")]
        assert fault.calls >= 2 and sorted(ran) == ["r1", "r2", "r3"]
        assert stop_worker(t, stop, outcome, BOUND_S).completed == 3
    finally:
        stop.set()
        store.close()


def test_take_returns_the_runs_taken_before_the_failure(db_url):
    """``take()`` itself: the rows it had already activated are returned (owned by the worker),
    not lost with the exception; the failure is raised only when nothing was taken."""
    store = fencepost.open(db_url)
    try:
        for r in ("r1", "r2"):
            store.runs.create(r, "{}")
        fault = FailAt(store, "claim", {2})
        fault.thread = threading.current_thread()
        worker = Worker(store, lambda ctx: None, concurrency=2)
        taken = worker.take(2)
        assert len(taken) == 1
        row = store.runs.get(taken[0].run_id)
        assert row.status == "running" and row.owner == worker.owner
        fault.at = {3}
        try:
            worker.take(1)  # the other run's claim fails, and nothing was taken: raised
        except RunStoreError as exc:
            assert exc.code == "persistence_failed"
        else:
            raise AssertionError("the failure was swallowed")
    finally:
        store.close()


def test_a_run_whose_read_after_activation_fails_is_still_run(db_url):
    """The sweep activated a run, then the read of its row failed: the run was this worker's, yet
    nobody held or ran it until its lease expired."""
    store = fencepost.open(db_url)
    stop = threading.Event()
    try:
        store.runs.create("r1", "{}")
        fault = FailAt(store, "get", {1, 2})
        ran: list[str] = []
        worker = Worker(store, lambda ctx: ran.append(ctx.run_id), concurrency=1)
        t, outcome = _worker_thread_of(fault, worker, stop)
        assert wait_for(lambda: store.runs.get("r1").status == "completed", BOUND_S), store.runs.get("r1").status
        assert ran == ["r1"] and fault.calls >= 3
        assert stop_worker(t, stop, outcome, BOUND_S).completed == 1
    finally:
        stop.set()
        store.close()


class _HoldsUntilDone:
    """A run function that checks its lease until ``done`` is set: the runs it started, the
    exceptions that ended them, and whether one is running now."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.seen: list[BaseException] = []
        self.running = threading.Event()
        self.done = threading.Event()

    def __call__(self, ctx: Any) -> None:
        self.running.set()
        self.started.append(ctx.run_id)
        try:
            while not self.done.is_set():
                ctx.lease.check()
                time.sleep(0.02)
        except BaseException as exc:
            self.seen.append(exc)
            raise
        finally:
            self.running.clear()


def test_a_run_taken_before_a_claim_release_waits_out_an_outage_is_run_and_held_meanwhile(outage_clocked):
    """The sweep activated one run, then the next candidate's activation met a database outage (a
    real held write lock) and its claim release retried within the claim's budget (up to 19 s) on
    the worker's main thread. The run already taken was neither started nor held until that retry
    ended: its function waited out the outage although it needed no write to start, and nothing
    renewed its lease. Held late, its lease then counted from the late hold rather than from its
    last persisted heartbeat, so during a longer outage the worker kept running it while a peer
    could already take it over. Now each run is held and started as soon as it is taken; the
    store clock (a ``ManualClock``) then shows its lease lapsing one write budget after its last
    persisted heartbeat, with every heartbeat failing."""
    store, holder, clock = outage_clocked
    for r in ("r1", "r2"):
        store.runs.create(r, "{}")
    real_activate, real_abandon = store.runs.activate, store.runs.abandon_claim
    activated: list[str] = []
    release_failures: list[str] = []
    fn = _HoldsUntilDone()
    started, seen = fn.started, fn.seen

    def activate(run_id: str, *args: Any, **kwargs: Any) -> Any:
        activated.append(run_id)
        if len(activated) == 2 and not holder.held:
            holder.hold()  # the outage begins between the first run's activation and the second's
        return real_activate(run_id, *args, **kwargs)

    def abandon_claim(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_abandon(*args, **kwargs)
        except RunStoreError:
            release_failures.append(",".join(started))  # which functions had started by then
            raise

    store.runs.activate, store.runs.abandon_claim = activate, abandon_claim
    worker = Worker(store, fn, concurrency=2)
    stop = threading.Event()
    t, outcome = run_in_thread(worker, stop)
    try:
        assert wait_for(lambda: bool(release_failures), OUTAGE_BOUND_S), "the outage never reached abandon_claim"
        # The first run is running while the release still retries: a release attempt fails after
        # its function started (before, it started only once the release had given up).
        assert wait_for(lambda: any(release_failures), OUTAGE_BOUND_S), (release_failures, started)
        first = activated[0]
        assert started == [first]
        heartbeat = store.runs.get(first).heartbeat_at_ms  # heartbeats fail under the lock: still its activation's
        clock.set(heartbeat + TOLERANCE_MS + 1)
        assert wait_for(lambda: bool(seen), OUTAGE_BOUND_S), "the lease outlived its write budget"
        assert isinstance(seen[0], LeaseLost), seen
    finally:
        fn.done.set()
        holder.free()
        stop.set()
        t.join(OUTAGE_BOUND_S)
    assert outcome and outcome[0].lost == 1, outcome


class _ReadOutage:
    """Reads of ``flows_runs`` refused as an unavailable database, made while ``down``: for real on
    PostgreSQL (another session holds an ACCESS EXCLUSIVE lock on the table, so every read of it
    times out on the store's 100 ms ``lock_timeout``); injected on SQLite, where a reader in WAL mode
    never waits for a lock, so no read there can fail for real (``runs.get`` raises the transient
    error the store raises for a busy database)."""

    def __init__(self, store: Any, db_url: str, backend: str) -> None:
        self.backend = backend
        self.failures: list[RunStoreError] = []  # what the worker's reads of the row met
        self.conn: Any = None
        self.down = threading.Event()
        if backend == "postgresql":
            self.schema = db_url.rsplit("schema=", 1)[1]
            self.engine = create_engine(db_url.rsplit("?", 1)[0], poolclass=NullPool)
        real_get = store.runs.get

        def get(*args: Any, **kwargs: Any) -> Any:
            try:
                if backend == "sqlite" and self.down.is_set():
                    raise unavailable("get")
                return real_get(*args, **kwargs)
            except RunStoreError as exc:
                self.failures.append(exc)
                raise

        store.runs.get = get

    def begin(self) -> None:
        if self.backend == "postgresql":
            self.conn = self.engine.connect()
            self.conn.exec_driver_sql("SET lock_timeout = '10s'")  # never hang the test on a reader
            self.conn.exec_driver_sql(f'LOCK TABLE "{self.schema}"."flows_runs" IN ACCESS EXCLUSIVE MODE')
        self.down.set()

    def end(self) -> None:
        self.down.clear()
        if self.conn is not None:
            self.conn.rollback()
            self.conn.close()
            self.conn = None

    def close(self) -> None:
        self.end()
        if self.backend == "postgresql":
            self.engine.dispose()


@pytest.mark.parametrize("reads_return", [True, False], ids=["read-goes-through", "read-never-does"])
def test_a_run_whose_read_after_activation_waits_out_an_outage_is_not_run_past_its_stored_lease(
        outage_clocked, db_url, backend, reads_return):
    """The sweep activated a run (its stored heartbeat: the activation's), then the outage began:
    the read of its row retried within the claim's budget (up to 19 s) and the run was held only
    once that read went through, its lease counting from that late hold rather than from its
    stored heartbeat. Here the store clock (a ``ManualClock``) passes the stored lease's write
    budget while the read retries; the read then goes through while writes are still refused (a
    real held write lock), so no heartbeat or reconfirm can land and a peer may take the run over
    soon. The worker kept running the run's function for another whole budget. Now the lease
    counts from the activation's heartbeat and bounds the read: the lease is reported lost and the
    function is not running, while the outage still holds. When reads stay refused too, the read
    gave up only at the claim's budget (19 s after the claim); now it ends with the lease, and the
    function never starts."""
    store, holder, clock = outage_clocked
    store.runs.create("r1", "{}")
    reads = _ReadOutage(store, db_url, backend)
    real_activate = store.runs.activate
    stamped: list[int] = []
    fn = _HoldsUntilDone()
    running, started, seen = fn.running, fn.started, fn.seen

    def activate(*args: Any, **kwargs: Any) -> Any:
        outcome = real_activate(*args, **kwargs)
        stamped.append(clock.now_ms())  # the clock stands still: this is the stored heartbeat
        holder.hold()  # the outage begins right after the activation committed
        reads.begin()
        return outcome

    store.runs.activate = activate
    worker = Worker(store, fn, concurrency=1)
    stop = threading.Event()
    t, outcome = run_in_thread(worker, stop)
    try:
        assert wait_for(lambda: bool(reads.failures), OUTAGE_BOUND_S), "the read after activation never failed"
        assert all(exc.code == "persistence_failed" and exc.transient for exc in reads.failures), reads.failures
        clock.set(stamped[0] + TOLERANCE_MS + 1)  # the stored lease's write budget is spent
        if reads_return:
            reads.end()  # the read goes through; the write lock is still held
        assert wait_for(lambda: worker.stats.lost == 1 and not running.is_set(), OUTAGE_BOUND_S), (
            "past the stored lease, the lease was not reported lost or the function still ran", worker.stats, seen)
        assert holder.held and reads.down.is_set() != reads_return  # all of it while the outage holds
        assert all(isinstance(exc, LeaseLost) for exc in seen), seen
        if not reads_return:
            assert started == [] and worker.stats.claimed == 0, (started, worker.stats)
    finally:
        fn.done.set()
        reads.close()
        holder.free()
        stop.set()
        t.join(OUTAGE_BOUND_S)
    assert outcome and outcome[0].lost == 1, outcome
