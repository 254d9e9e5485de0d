"""A sweep that fails partway never strands the runs it already took.

``Worker.take`` claims and activates runs one by one; when a later step of the sweep failed (the
database went away after some runs were activated), the exception left ``take`` and the rows already
taken with it: those runs sat ``running`` under a lease nobody renewed, until it expired (30 s) and
a peer (or this worker) took them over. The failure is injected deterministically at the N-th call
of a store method (both backends, real store otherwise). Each test's docstring says what was wrong.
"""

from __future__ import annotations

import threading

import fencepost
from fencepost.errors import RunStoreError
from fencepost.worker import Worker
from tests.worker.conftest import FailAt, run_in_thread, stop_worker, wait_for

BOUND_S = 5  # far below the 30 s a stranded run waited for its lease to expire


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
