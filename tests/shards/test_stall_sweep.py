"""A shard-set member that stalls without failing delays only its own runs in a ``Worker``'s sweep.

Defect: a worker read its members' candidates one after another, so a member whose runs table was
locked (PostgreSQL ``LOCK TABLE ... ACCESS EXCLUSIVE``, as a ``VACUUM FULL`` or an ``ALTER`` takes it:
a read waits for it as long as it is held, with no timeout) held up the whole sweep, and runs on
the healthy members were not taken until the lock was gone; the worker's read of cancel requests
(every member, once per heartbeat interval) stalled its loop the same way. The members are now read
at once, each on a thread of its own; one that has not answered within ``MEMBER_READ_WAIT_S`` is
left out of that sweep (a warning names it) and read again once its read returns: at most one read
per member is outstanding, however many sweeps go by.

SQLite has no such stall: its reads never wait for a writer (WAL), so a member's held write lock
delays its own claims, not the reads (see ``test_a_write_locked_member_does_not_hold_up_the_others``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import fencepost
from fencepost.worker import Worker
from tests.worker.conftest import LockHolder, run_in_thread, stop_worker, wait_for


def _placed_on(shards: fencepost.ShardSet, name: str, prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(1000) if shards.place(f"{prefix}{i}") == name][:count]


class TableLock:
    """Another connection holding ``LOCK TABLE flows_runs IN ACCESS EXCLUSIVE MODE`` in a PostgreSQL
    member's schema: every read and write of the runs table waits for it."""

    def __init__(self, url: str) -> None:
        self.schema = url.rsplit("schema=", 1)[1]
        self.engine = create_engine(url.rsplit("?", 1)[0], poolclass=NullPool)
        self.conn = self.engine.connect()
        self.held = False

    def hold(self) -> None:
        self.conn.exec_driver_sql(f'LOCK TABLE "{self.schema}".flows_runs IN ACCESS EXCLUSIVE MODE')
        self.held = True

    def free(self) -> None:
        if self.held:
            self.held = False
            self.conn.rollback()

    def close(self) -> None:
        self.free()
        self.conn.close()
        self.engine.dispose()


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fencepost-member-")]


# PostgreSQL only: SQLite reads never wait for a lock (WAL), so a read cannot stall there (the
# held-write-lock test below covers SQLite's stall, a claim).
@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_member_whose_runs_table_is_locked_does_not_hold_up_the_others(
        shard_urls: Callable[[int], list[str]], backend: str, caplog: pytest.LogCaptureFixture) -> None:
    urls = shard_urls(2)
    lock = TableLock(urls[1])
    done: list[str] = []
    caplog.set_level(logging.WARNING, logger="fencepost.worker")
    try:
        with fencepost.open_shards(urls) as shards:
            ids = {name: _placed_on(shards, name, "s", 2) for name in shards.names}
            for group in ids.values():
                for rid in group:
                    shards.runs.create(rid, "{}")
            lock.hold()
            stop = threading.Event()
            worker = Worker(shards, lambda ctx: done.append(ctx.run_id), concurrency=4)
            thread, outcome = run_in_thread(worker, stop)
            try:
                began = time.monotonic()
                assert wait_for(lambda: set(ids["shard-0"]) <= set(done), 8), done
                took = time.monotonic() - began
                # Many sweeps and a cancel-request read while the member stays locked: at most one
                # reader thread per member at any time (the locked member's one read still waiting).
                most = 0
                for _ in range(75):
                    most = max(most, len(_reader_threads()))
                    time.sleep(0.02)
                assert 1 <= most <= 2, most
                assert not set(ids["shard-1"]) & set(done)
                assert outcome == [], outcome  # the worker is still sweeping
                stalled = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
                assert stalled and "shard-1" in stalled[0], stalled
                assert len(stalled) == 1, stalled  # once, not at every sweep
                lock.free()
                assert wait_for(lambda: set(ids["shard-1"]) <= set(done), 10), done
            finally:
                lock.free()
                stats = stop_worker(thread, stop, outcome, 20)
            assert took < 5, took
            assert stats.completed == 4, stats
            for rid in ids["shard-0"] + ids["shard-1"]:
                assert shards.runs.get(rid).status == "completed"
            assert wait_for(lambda: not _reader_threads(), 5), _reader_threads()
    finally:
        lock.close()


def test_a_write_locked_member_does_not_hold_up_the_others(
        shard_urls: Callable[[int], list[str]], backend: str) -> None:
    """A member whose write lock another connection holds: its runs wait for the lock; the other
    member's runs are taken and run meanwhile (within a second or two, not after the lock)."""
    urls = shard_urls(2)
    holder = LockHolder(urls[1], backend)
    done: list[str] = []
    try:
        with fencepost.open_shards(urls) as shards:
            ids = {name: _placed_on(shards, name, "w", 3) for name in shards.names}
            for group in ids.values():
                for rid in group:
                    shards.runs.create(rid, "{}")
            holder.hold()
            stop = threading.Event()
            thread, outcome = run_in_thread(Worker(shards, lambda ctx: done.append(ctx.run_id), concurrency=4), stop)
            try:
                assert wait_for(lambda: set(ids["shard-0"]) <= set(done), 8), done  # before: > 25 s
                assert not set(ids["shard-1"]) & set(done)
                holder.free()
                assert wait_for(lambda: set(ids["shard-1"]) <= set(done), 30), done
            finally:
                holder.free()
                stop_worker(thread, stop, outcome, 30)
    finally:
        holder.close()


def test_a_single_store_worker_reads_on_its_own_thread(db_url: str) -> None:
    """A plain store is read on the sweeping thread as before: no reader thread, ever."""
    seen: list[int] = []
    with fencepost.open(db_url) as store:
        for i in range(3):
            store.runs.create(f"p{i}", "{}")
        stats = Worker(store, lambda ctx: seen.append(len(_reader_threads())), concurrency=2).run(until_idle=True)
        assert stats.completed == 3
        assert seen == [0, 0, 0]


def test_take_returns_the_healthy_members_runs_and_hands_a_late_one_over_next_time(
        shard_urls: Callable[[int], list[str]], backend: str) -> None:
    """``take()`` over a set with a write-locked member answers with the other member's runs after
    ``MEMBER_WAIT_S``; the run the locked member was taking when the lock went is activated then,
    and the next ``take()`` returns it (never left ``running`` with nobody told)."""
    urls = shard_urls(2)
    holder = LockHolder(urls[1], backend)
    try:
        with fencepost.open_shards(urls) as shards:
            ids = {name: _placed_on(shards, name, "k", 2) for name in shards.names}
            for group in ids.values():
                for rid in group:
                    shards.runs.create(rid, "{}")
            worker = Worker(shards, lambda ctx: None)
            holder.hold()
            began = time.monotonic()
            first = worker.take(4)
            assert time.monotonic() - began < 5
            assert sorted(r.run_id for r in first) == sorted(ids["shard-0"])
            holder.free()
            assert wait_for(lambda: any(shards.runs.get(r).status == "running" for r in ids["shard-1"]), 15)
            assert wait_for(lambda: not _reader_threads(), 5), _reader_threads()
            second = worker.take(4)
            assert sorted(r.run_id for r in second) == sorted(ids["shard-1"])
            for row in first + second:
                assert row.owner == worker.owner and row.status == "running"
                assert shards.runs.get(row.run_id).owner == worker.owner
            assert worker.take(4) == []
    finally:
        holder.close()
