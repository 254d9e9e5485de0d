"""What the worker's outage tests share: a worker run on a thread, real outages (another connection
holding the store's write lock past its wait) and injected ones (a store method that fails as an
unavailable database), on both backends.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import fencepost
from fencepost.clock import ManualClock
from fencepost.errors import RunStoreError
from fencepost.journal import companion_stream
from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Claimed
from fencepost.worker import Worker


def wait_for(pred: Callable[[], Any], timeout: float) -> bool:
    """Whether ``pred()`` became true within ``timeout`` seconds (polled every 20 ms)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


def run_in_thread(worker: Worker, stop: threading.Event) -> tuple[threading.Thread, list]:
    """``worker.run(stop)`` on a daemon thread: the thread, and a list that gets its outcome."""
    outcome: list = []

    def body() -> None:
        try:
            outcome.append(worker.run(stop))
        except BaseException as exc:  # the defect some tests look for: a database error ended the worker
            outcome.append(exc)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, outcome


def stop_worker(t: threading.Thread, stop: threading.Event, outcome: list, timeout: float) -> Any:
    """Set ``stop``, wait up to ``timeout`` s for the worker on ``t`` to return; what ``run()`` returned
    (or the exception that ended it)."""
    stop.set()
    t.join(timeout)
    assert outcome, "the worker did not return after stop"
    return outcome[0]


def unavailable(method: str, db_code: str = "SQLITE_BUSY", detail: str = "run persistence failed") -> RunStoreError:
    """The error a run store method raises when the database is unavailable or busy (transient)."""
    err = RunStoreError("persistence_failed", method, detail)
    err.db_code = db_code  # type: ignore[attr-defined]
    err.transient = True  # type: ignore[attr-defined]
    return err


class Faulty:
    """Wraps ``store.runs.transition_owned``: raises a transient (or given) database error while
    ``down`` is set, and records every call that reached the real store."""

    def __init__(self, store: Any, error: RunStoreError | None = None) -> None:
        self.real = store.runs.transition_owned
        self.down = threading.Event()
        self.failed = 0
        self.reached: list[tuple[str, str]] = []
        self.error = error
        store.runs.transition_owned = self  # instance attribute: only this store is affected

    def __call__(self, run_id, owner, to, *args, **kwargs):
        if self.down.is_set():
            self.failed += 1
            raise self.error if self.error is not None else unavailable("transition_owned")
        self.reached.append((run_id, to))
        return self.real(run_id, owner, to, *args, **kwargs)


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
                raise unavailable(self.method)
        return self.real(*args, **kwargs)


@dataclass
class CheckpointRetrying:
    """A worker whose one run took the database down (``faulty``) and is retrying a checkpoint."""

    faulty: Faulty
    seen: list  # what the checkpoint raised into the function
    worker: Worker
    t: threading.Thread
    stop: threading.Event
    outcome: list


@contextmanager
def checkpoint_retrying(store: Any, timeout: float) -> Iterator[CheckpointRetrying]:
    """Run a worker on ``store`` (its one run created by the caller) whose function takes the
    database down and checkpoints; enter once the checkpoint has failed twice and is retrying, not
    raised. On leaving, the database answers again and the worker is stopped (``timeout``)."""
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
    t, outcome = run_in_thread(worker, stop)
    try:
        assert wait_for(lambda: faulty.failed >= 2, timeout)
        yield CheckpointRetrying(faulty, seen, worker, t, stop, outcome)
    finally:
        faulty.down.clear()
        stop.set()
        t.join(timeout)


# ---------------------------------------------------------------------- a real outage: a held lock


def short_wait(url: str, backend: str) -> str:
    """``url`` with a 100 ms wait for another writer's lock, for the whole call (``busy_timeout_ms``);
    on PostgreSQL also for any other lock a statement waits for, a read's included (``lock_timeout``)."""
    sep = "&" if "?" in url else "?"
    if backend == "sqlite":
        return f"{url}{sep}busy_timeout_ms=100"
    return f"{url}{sep}busy_timeout_ms=100&options=-c%20lock_timeout%3D100"


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


def assert_write_fails_now(store: Any) -> None:
    """The holder really makes writes fail (the outage is real, not a slow write)."""
    with pytest.raises(RunStoreError) as info:
        store.runs.create("probe", "{}")
    assert info.value.code == "persistence_failed"
    assert info.value.transient is True  # type: ignore[attr-defined] - waiting may cure it


@pytest.fixture
def outage(db_url: str, backend: str) -> Iterator[tuple[Any, LockHolder]]:
    """``(store, holder)``: a store that waits 100 ms for a lock, and a holder of its write lock."""
    store = fencepost.open(short_wait(db_url, backend))
    holder = LockHolder(db_url, backend)
    try:
        yield store, holder
    finally:
        holder.close()
        store.close()


@pytest.fixture
def outage_clocked(db_url: str, backend: str, clock: ManualClock) -> Iterator[tuple[Any, LockHolder, ManualClock]]:
    """``outage`` with the store on the ``ManualClock`` ``clock``: ``(store, holder, clock)``."""
    store = fencepost.open(short_wait(db_url, backend), clock=clock)
    holder = LockHolder(db_url, backend)
    try:
        yield store, holder, clock
    finally:
        holder.close()
        store.close()


def own(store, run_id: str, owner: OwnerId) -> None:
    """Make ``owner`` the running owner of ``run_id`` (claim, then activate)."""
    row = store.runs.get(run_id)
    claimed = store.runs.claim(run_id, row.snapshot(), owner, store.clock.now_ms())
    assert isinstance(claimed, Claimed)
    store.runs.activate(run_id, owner, claimed.claimed_at_ms, row)


def facts(store, run_id: str) -> list[str]:
    """The kinds of the ownership facts in ``run_id``'s companion stream, in order."""
    page = store.journal.entries(companion_stream(run_id))
    return [e.event_type.rsplit(".", 1)[-1] for e in page.entries]
