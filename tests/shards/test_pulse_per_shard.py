"""A worker over a shard set pulses each shard on its own: a shard whose write lock is held delays
only its own runs' heartbeats.

Defect: the worker's one supervisor renewed every lease with one sharded ``heartbeat_many`` per
interval, which answers once every shard did. A shard whose write lock another connection holds
makes each of its heartbeats wait for the store's whole busy timeout (10 s), so each pulse took
10 s for every shard: with the lock held past the write tolerance (19 s) the healthy shard's runs
went unrenewed long enough to be reconfirmed (a ``lease-reconfirmed`` entry each), and a shard
blocked for ever made them lapse. The worker now holds each run under its shard's own supervisor.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

import pytest

import fencepost
from fencepost.runstore.ownership import TOLERANCE_MS
from fencepost.worker import RunContext, Worker
from tests.worker.conftest import LockHolder, run_in_thread, stop_worker, wait_for


def _placed_on(shards: fencepost.ShardSet, name: str, prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(1000) if shards.place(f"{prefix}{i}") == name][:count]


def _decisions(shards: fencepost.ShardSet, run_id: str) -> list[str]:
    return [e.payload.get("decision") for e in shards.journal.entries(run_id).entries
            if isinstance(e.payload, dict)]


def test_a_shard_locked_past_the_tolerance_delays_only_its_own_heartbeats(
        shard_urls: Callable[[int], list[str]], backend: str, caplog: pytest.LogCaptureFixture) -> None:
    urls = shard_urls(2)
    holder = LockHolder(urls[1], backend)  # the store's default wait for a lock: 10 s
    started: set[str] = set()
    lost: set[str] = set()
    release = threading.Event()

    def work(ctx: RunContext) -> dict[str, int]:
        started.add(ctx.run_id)
        try:
            while not release.is_set():
                ctx.check()
                time.sleep(0.05)
        except fencepost.worker.LeaseLost:
            lost.add(ctx.run_id)
            raise
        return {"ok": 1}

    caplog.set_level(logging.WARNING, logger="fencepost.ownership")
    try:
        with fencepost.open_shards(urls) as shards:
            ids = {name: _placed_on(shards, name, "h", 2) for name in shards.names}
            healthy, blocked = ids["shard-0"], ids["shard-1"]
            for rid in healthy + blocked:
                shards.runs.create(rid, "{}")
            stop = threading.Event()
            worker = Worker(shards, work, concurrency=4)
            thread, outcome = run_in_thread(worker, stop)
            try:
                assert wait_for(lambda: len(started) == 4, 20), started
                holder.hold()
                held_at = time.monotonic()
                stamps: dict[str, list[int]] = {rid: [] for rid in healthy}
                # Past the write tolerance, and past the lapse of the blocked shard's leases.
                while time.monotonic() - held_at < TOLERANCE_MS / 1000 + 3:
                    for rid in healthy:  # read from the healthy shard itself, never blocked
                        stamps[rid].append(shards["shard-0"].runs.get(rid).heartbeat_at_ms)
                    time.sleep(0.5)
                assert wait_for(lambda: set(blocked) <= lost, 10), lost
                holder.free()
                release.set()
                assert wait_for(lambda: all(shards.runs.get(r).status == "completed" for r in healthy), 20)
            finally:
                release.set()
                holder.free()
                stats = stop_worker(thread, stop, outcome, 30)
            for rid in healthy:
                # Renewed about every interval all along: never more than a few seconds apart.
                seen = sorted(set(stamps[rid]))
                gaps = [b - a for a, b in itertools.pairwise(seen)]
                assert len(seen) >= 10 and max(gaps) < 5_000, (rid, gaps)
                assert "lease-reconfirmed" not in _decisions(shards, rid), rid
            assert not lost & set(healthy), lost
            messages = [(r.getMessage(), getattr(r, "run_id", None)) for r in caplog.records]
            failed = {rid for text, rid in messages if "heartbeat write failed" in text}
            lapsed = {rid for text, rid in messages if "lease lapsed" in text}
            assert failed == set(blocked), failed  # as one blocked store's: failed writes, then a lapse
            assert lapsed == set(blocked), lapsed
            assert stats.completed == 2 and stats.lost == 2, stats
    finally:
        holder.close()
