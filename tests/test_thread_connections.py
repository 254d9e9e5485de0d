"""Any number of threads (and async followers) can use one store; the connection pool bounds only
how many transactions run at once.

Each thread keeps its own connection between calls, for speed. Those kept connections were never
given back while their thread lived, so once more threads had used a store than its pool holds (32),
the next thread waited 30 s for a connection and failed with a bare ``persistence_failed``, though
every other thread sat idle: a worker host with 64 threads, or 20 ``afollow`` followers (on SQLite
each also kept a second connection for change detection) and then one ``asyncio.to_thread`` write.
Real threads against a real database, both backends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Connection

import fencepost
from fencepost import _durable
from fencepost.errors import FencepostError

THREADS = 64  # twice the pool's 32 connections (eight times the small pool's)
DEADLINE = 20.0  # seconds for everything; the pool's own wait was 30 s
SMALL = (2, 6)  # a pool of 8: the same shortage with few server sessions (the test server allows 100)


@pytest.fixture
def small_pool_store(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[fencepost.Store]:
    """A store whose pool holds 8 connections instead of 32."""
    monkeypatch.setattr(_durable, "POOL_SIZE", SMALL[0], raising=False)
    monkeypatch.setattr(_durable, "POOL_OVERFLOW", SMALL[1], raising=False)
    store = fencepost.open(db_url)
    try:
        yield store
    finally:
        store.close()


def test_more_live_threads_than_pooled_connections_all_read_and_write(small_pool_store: fencepost.Store) -> None:
    store = small_pool_store
    store.runs.create("shared", "{}")
    errors: list[str] = []
    rounds = 3
    # Every thread finishes a round before any starts the next, so all 64 hold their connections
    # (idle) at once, as a server's threads do between requests.
    barrier = threading.Barrier(THREADS, timeout=DEADLINE)
    finished = threading.Semaphore(0)

    def client(i: int) -> None:
        try:
            for r in range(rounds):
                assert store.runs.get("shared").run_id == "shared"
                store.runs.create(f"client-{i}-{r}", "{}")
                barrier.wait()
        except Exception as exc:  # reported by the main thread
            errors.append(repr(exc))
            barrier.abort()
        finished.release()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(THREADS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + DEADLINE
    done = sum(finished.acquire(timeout=max(0.0, deadline - time.monotonic())) for _ in threads)
    assert done == THREADS, f"{THREADS - done} threads still waiting after {DEADLINE} s"
    assert [e for e in errors if "BrokenBarrierError" not in e] == []
    assert errors == []
    assert store.feed.count_runs() == THREADS * rounds + 1


def test_many_async_followers_leave_connections_for_to_thread_writes(store: fencepost.Store) -> None:
    """The pool of 32 as it is: 34 followers (each on a thread of its own, keeping a read connection,
    and on SQLite a second one for change detection; on PostgreSQL a listener outside the pool)."""
    followers, writes = 34, 16

    async def main() -> tuple[list[str], list[set[str]]]:
        seen: list[set[str]] = [set() for _ in range(followers)]

        async def consume(i: int) -> None:
            async for change in store.feed.afollow(poll_interval=60):
                seen[i].add(change.run_id)

        tasks = [asyncio.create_task(consume(i)) for i in range(followers)]
        try:
            # Every follower has paged once (and keeps its connections) before the writes start.
            store.runs.create("first", "{}")
            deadline = time.monotonic() + DEADLINE
            while not all("first" in s for s in seen) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            outcomes = await asyncio.wait_for(asyncio.gather(
                *[asyncio.to_thread(store.runs.create, f"w{i}", "{}") for i in range(writes)],
                return_exceptions=True), DEADLINE)
            wanted = {"first"} | {f"w{i}" for i in range(writes)}
            while not all(s >= wanted for s in seen) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            return [repr(o) for o in outcomes if isinstance(o, BaseException)], seen
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    failures, seen = asyncio.run(main())
    assert failures == []
    wanted = {"first"} | {f"w{i}" for i in range(writes)}
    assert [i for i, s in enumerate(seen) if s != wanted] == []


def test_a_thread_that_finds_every_connection_in_a_transaction_gets_an_error_naming_the_limit(
        small_pool_store: fencepost.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only transactions in progress hold connections; when all of them are, the next call waits
    for one (``POOL_WAIT``, 30 s; shortened here) and then says so, rather than a bare failure."""
    store = small_pool_store
    monkeypatch.setattr(_durable, "POOL_WAIT", 1.0, raising=False)
    store.runs.create("shared", "{}")
    limit = sum(SMALL)
    release = threading.Event()
    inside = threading.Semaphore(0)
    held: list[object] = []

    def hold(conn: Connection) -> None:
        inside.release()
        release.wait(DEADLINE)
        # The waiting call looked for idle connections to take back all along: never these.
        held.append(conn.exec_driver_sql("SELECT 1").scalar())

    def holder() -> None:
        try:
            store.db.read(hold)
        except Exception as exc:  # reported by the main thread
            held.append(repr(exc))

    holders = [threading.Thread(target=holder, daemon=True) for _ in range(limit)]
    for t in holders:
        t.start()
    try:
        assert all(inside.acquire(timeout=DEADLINE) for _ in holders)
        started = time.monotonic()
        with pytest.raises(FencepostError) as caught:
            store.runs.get("shared")
        waited = time.monotonic() - started
    finally:
        release.set()
        for t in holders:
            t.join(DEADLINE)
    err = caught.value
    assert err.code == "persistence_failed"
    assert f"all {limit} connections" in str(err)
    assert err.transient is True
    assert waited < DEADLINE
    assert held == [1] * limit
    assert store.runs.get("shared").run_id == "shared"  # once they end, connections are free again
