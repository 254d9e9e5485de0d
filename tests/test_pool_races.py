"""Races between the connection pool's reclaim of idle threads' connections and the connections
that must not be taken back or that wait for a checkout. Real threads, real databases.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import fencepost
from fencepost import _durable
from fencepost.errors import ProjectionError
from fencepost.projections._lock import BuilderLock

SMALL = (2, 6)  # a pool of 8 connections
DEADLINE = 20.0


@pytest.fixture
def small_pool_url(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(_durable, "POOL_SIZE", SMALL[0], raising=False)
    monkeypatch.setattr(_durable, "POOL_OVERFLOW", SMALL[1], raising=False)
    yield db_url


class _Parked:
    """Threads that each read once (keeping their connection) and then sit idle until stopped:
    ``count`` of them, or (``count`` None) as many as fill the store's pool."""

    def __init__(self, store: fencepost.Store, count: int | None) -> None:
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        pool = store.db.engine.pool
        limit = sum(SMALL)

        def park(ready: threading.Event) -> None:
            try:
                store.db.read(lambda c: c.exec_driver_sql("SELECT 1").scalar())
            except Exception as exc:  # reported by the test
                self.errors.append(repr(exc))
            ready.set()
            self._stop.wait(DEADLINE * 3)

        while (len(self._threads) < count) if count is not None else (pool.checkedout() < limit):  # type: ignore[attr-defined]
            ready = threading.Event()
            t = threading.Thread(target=park, args=(ready,), daemon=True)
            t.start()
            self._threads.append(t)
            assert ready.wait(DEADLINE)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(DEADLINE)


@pytest.mark.parametrize("backend", ["postgresql"])
def test_builder_lock_survives_pool_exhaustion_and_reclaim(small_pool_url: str) -> None:
    """PostgreSQL only: the builder's lock is a session advisory lock on a connection of its own
    (SQLite's is an ``flock`` beside the file, no connection involved).

    The lock's connection came from the store's pool but outside the reclaim path: with every
    pooled connection kept by an idle thread, taking the lock waited the pool's own 30 s and then
    failed with SQLAlchemy's bare TimeoutError; and it held one of the pool's connections for the
    builder's whole life."""
    store = fencepost.open(small_pool_url)
    other = fencepost.open(small_pool_url)
    parked = _Parked(store, None)
    lock = BuilderLock(store.db, "proj")
    try:
        assert parked.errors == []
        assert store.db.engine.pool.checkedout() == sum(SMALL)  # type: ignore[attr-defined]
        lock.acquire(0)  # the pool is full of idle threads' kept connections
        assert lock.held
        # More threads than the pool holds come and go, taking back idle connections.
        more = _Parked(store, sum(SMALL) * 2)
        more.stop()
        assert more.errors == []
        lock.acquire(0)  # still held: the same session
        with pytest.raises(ProjectionError) as caught:
            BuilderLock(other.db, "proj").acquire(0)
        assert caught.value.code == "builder_busy"
    finally:
        parked.stop()
        lock.release()
        other.close()
        store.close()
    # Released: another builder takes the name at once.
    again = fencepost.open(small_pool_url)
    try:
        second = BuilderLock(again.db, "proj")
        second.acquire(0)
        second.release()
    finally:
        again.close()
