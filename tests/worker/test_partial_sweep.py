"""A sweep that fails partway never strands the runs it already took.

``Worker.take`` claims and activates runs one by one; when a later step of the sweep failed (the
database went away after some runs were activated), the exception left ``take`` and the rows already
taken with it: those runs sat ``running`` under a lease nobody renewed, until it expired (30 s) and
a peer (or this worker) took them over. The failure is injected deterministically at the N-th call
of a store method (both backends, real store otherwise). Each test's docstring says what was wrong.
"""

from __future__ import annotations

import threading
from typing import Any

import fencepost
from fencepost.errors import RunStoreError
from fencepost.worker import Worker
from tests.worker.test_database_outage import _run_in_thread, _wait_for

BOUND_S = 5  # far below the 30 s a stranded run waited for its lease to expire


def _unavailable(method: str) -> RunStoreError:
    err = RunStoreError("persistence_failed", method, "run persistence failed")
    err.db_code = "SQLITE_BUSY"  # type: ignore[attr-defined]
    err.transient = True  # type: ignore[attr-defined]
    return err


class FailAt:
    """Replaces ``store.runs.<method>``: calls number ``at`` (1-based) fail as an unavailable
    database, when made from ``thread`` (the worker's), every other call goes through."""

    def __init__(self, store: Any, method: str, at: set[int]) -> None:
        self.real = getattr(store.runs, method)
        self.method = method
        self.at = at
        self.calls = 0
        self.thread: threading.Thread | None = None
        setattr(store.runs, method, self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is self.thread:
            self.calls += 1
            if self.calls in self.at:
                raise _unavailable(self.method)
        return self.real(*args, **kwargs)


def _worker_thread_of(fault: FailAt, worker, stop):
    """Start ``worker.run(stop)`` on a thread that ``fault`` watches."""
    started = threading.Event()
    orig = worker.run

    def run(stop_event):
        fault.thread = threading.current_thread()
        started.set()
        return orig(stop_event)

    worker.run = run
    t, outcome = _run_in_thread(worker, stop)
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
        assert _wait_for(lambda: all(store.runs.get(r).status == "completed" for r in ("r1", "r2", "r3")),
                         BOUND_S), [store.runs.get(r).status for r in ("r1", "r2", "r3")]
        assert fault.calls >= 2 and sorted(ran) == ["r1", "r2", "r3"]
        stop.set()
        t.join(BOUND_S)
        assert outcome and outcome[0].completed == 3
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
        assert _wait_for(lambda: store.runs.get("r1").status == "completed", BOUND_S), store.runs.get("r1").status
        assert ran == ["r1"] and fault.calls >= 3
        stop.set()
        t.join(BOUND_S)
        assert outcome and outcome[0].completed == 1
    finally:
        stop.set()
        store.close()
