"""A worker outlives a database that is briefly unavailable: its sweep waits the failure out and goes
on, instead of the exception ending ``Worker.run`` (and with it the ``fencepost worker`` process and
every run in hand). SQLite: another connection holds the write lock past the busy timeout.
PostgreSQL: a private server (never the shared one) stopped, then started again. A closed store still
ends the worker at once. Each test's docstring says what was wrong.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from typing import Any

import pytest

import fencepost
from fencepost.worker import Worker
from tests.faults.conftest import private_server  # noqa: F401 - fixture
from tests.worker.conftest import run_in_thread, stop_worker, unavailable, wait_for


def _outage_met_and_waited_out(caplog, outcome: list, timeout: float) -> None:
    """The worker met the outage (it logged "database unavailable") and did not end over it."""
    assert wait_for(lambda: bool(outcome) or any("database unavailable" in r.getMessage() for r in caplog.records),
                    timeout)
    assert not outcome, f"the worker ended: {outcome!r}"


def _completed_then_stopped(store, run_id: str, t: threading.Thread, stop: threading.Event, outcome: list,
                            timeout: float) -> Any:
    """``run_id`` completes once the database is back, the worker still running; then it is stopped:
    what ``run()`` returned."""
    assert wait_for(lambda: store.runs.get(run_id).status == "completed", timeout)
    assert not outcome and t.is_alive()
    return stop_worker(t, stop, outcome, timeout)


def test_sqlite_write_lock_held_past_the_busy_timeout_does_not_end_the_worker(tmp_path, caplog):
    """A claim that met another connection's write lock past ``busy_timeout_ms`` raised
    ``persistence_failed`` out of ``Worker.run``: the worker (a ``fencepost worker`` process) died
    with a traceback, though the lock was released a moment later."""
    path = tmp_path / "flows.db"
    store = fencepost.open(f"sqlite:///{path}?busy_timeout_ms=100")
    stop = threading.Event()
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        store.runs.create("r1", "{}")
        holder.execute("BEGIN IMMEDIATE")  # a peer's long write transaction
        worker = Worker(store, lambda ctx: {"done": True}, concurrency=1)
        with caplog.at_level(logging.WARNING, logger="fencepost.worker"):
            t, outcome = run_in_thread(worker, stop)
            _outage_met_and_waited_out(caplog, outcome, 5)
        holder.execute("ROLLBACK")
        assert _completed_then_stopped(store, "r1", t, stop, outcome, 5).completed == 1
    finally:
        stop.set()
        holder.close()
        store.close()


@pytest.mark.slow
def test_postgresql_server_stopped_and_started_under_a_running_worker(private_server, caplog):  # noqa: F811
    """With the server down past the retry budget of one call (a few seconds), the sweep's read raised
    ``persistence_failed`` out of ``Worker.run``: the worker died, and a run created once the server
    was back was never taken."""
    store = fencepost.open(private_server.url)
    stop = threading.Event()
    try:
        store.runs.create("before", "{}")
        worker = Worker(store, lambda ctx: {"done": True}, concurrency=1)
        with caplog.at_level(logging.WARNING, logger="fencepost.worker"):
            t, outcome = run_in_thread(worker, stop)
            assert wait_for(lambda: store.runs.get("before").status == "completed", 10)
            private_server._run("pg_ctl", "-D", str(private_server.data), "-m", "fast", "-w", "stop")
            # Down until a sweep has given up on one call (or the worker ended): bounded.
            _outage_met_and_waited_out(caplog, outcome, 15)
        private_server.start()
        store.runs.create("after", "{}")
        assert _completed_then_stopped(store, "after", t, stop, outcome, 10).completed == 2
    finally:
        stop.set()
        store.close()


def test_a_closed_store_still_ends_the_worker(tmp_path):
    """Regression guard: only an unavailable database is waited out; a closed store never comes back,
    so the worker ends with its error."""
    store = fencepost.open(f"sqlite:///{tmp_path / 'flows.db'}")
    worker = Worker(store, lambda ctx: None, concurrency=1)
    stop = threading.Event()
    t, outcome = run_in_thread(worker, stop)
    time.sleep(0.3)
    store.close()
    t.join(5)
    stop.set()
    assert outcome and isinstance(outcome[0], fencepost.RunStoreError)
    assert outcome[0].db_code == "closed"


def test_a_sqlite_file_replaced_under_the_worker_ends_it(tmp_path, caplog):
    """A writable store keeps to the file it opened, so once another file is moved over its path
    every sweep fails with ``file_replaced``, which no wait cures (open the store again). The sweep
    took it for an outage: the worker logged 'database unavailable' and swept on forever. SQLite
    only by nature (PostgreSQL has no file to replace)."""
    path = tmp_path / "flows.db"
    store = fencepost.open(f"sqlite:///{path}")
    stop = threading.Event()
    try:
        worker = Worker(store, lambda ctx: None, concurrency=1)
        t, outcome = run_in_thread(worker, stop)
        time.sleep(0.3)
        fencepost.open(f"sqlite:///{tmp_path / 'other.db'}").close()
        os.replace(tmp_path / "other.db", path)
        t.join(5)
        assert outcome, "the worker swept on over a replaced file"
        assert isinstance(outcome[0], fencepost.RunStoreError) and outcome[0].db_code == "file_replaced"
    finally:
        stop.set()
        store.close()


class _Flag:
    """A stop signal of one's own: ``is_set()`` and nothing else (no ``wait``), as the docs allow."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()


def test_a_stop_signal_without_wait_outlives_an_outage(db_url, caplog, monkeypatch):
    """``run(stop)`` accepts any object with ``is_set()``, yet the sweep's back-off during an outage
    called ``stop.wait(backoff)``: with such a stop the first unavailable sweep ended the worker with
    ``AttributeError``. The back-off now waits on ``is_set()`` alone; a stop still ends it promptly."""
    store = fencepost.open(db_url)
    stop = _Flag()
    try:
        store.runs.create("r1", "{}")
        worker = Worker(store, lambda ctx: {"done": True}, concurrency=1)
        sweep, failures = worker._sweep, [3]

        def flaky_sweep(*args: Any, **kwargs: Any) -> Any:
            if failures[0]:
                failures[0] -= 1
                raise unavailable("claim")
            return sweep(*args, **kwargs)

        monkeypatch.setattr(worker, "_sweep", flaky_sweep)
        with caplog.at_level(logging.WARNING, logger="fencepost.worker"):
            t, outcome = run_in_thread(worker, stop)  # type: ignore[arg-type]
            _outage_met_and_waited_out(caplog, outcome, 5)
        assert _completed_then_stopped(store, "r1", t, stop, outcome, 10).completed == 1  # type: ignore[arg-type]
        assert failures == [0]
    finally:
        stop.set()
        store.close()
