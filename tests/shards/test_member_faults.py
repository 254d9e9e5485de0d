"""One member of a shard set failing: the other members carry on, and the error names the member.

Defects (found by a shard-set review), each with a real fault on both backends (another connection
holding a member's write lock past the store's wait; a member's SQLite file moved away or its
PostgreSQL schema renamed away):

- ``runs.heartbeat_many`` over runs of several shards wrote shard by shard and stopped at the first
  that failed: the shards before it had committed, the ones after were never written, and the error
  (``store=None``, no results) made a ``Worker``'s supervisor treat every lease of the pulse as failing
  ("heartbeat write failed" logged for runs on the healthy shard, ``lease-reconfirmed`` entries on
  them once the tolerance ran out). Every shard is now written; the error names the failed shard
  and carries the committed shards' outcomes (``results``), which the supervisor counts as renewed.
- A run reached by a lookup (a fork child living on its parent's shard, its id placed on another)
  could not be found while its placed shard was down: the lookup raised at the first shard that
  failed, ``store=None``. It now asks the other shards too, and names the failed shard only when
  none of them holds the run.
- ``ShardSet.positions()`` raised with ``store=None`` where ``changes()`` named the shard.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import fencepost
from fencepost.clock import ManualClock
from fencepost.errors import FencepostError, RunStoreError
from fencepost.journal.owner import OwnerId
from fencepost.runstore import RunSnapshot
from fencepost.runstore.outcomes import Updated
from fencepost.runstore.ownership import INTERVAL_MS, TOLERANCE_MS, Supervisor
from fencepost.worker import Worker
from tests.conftest import require_postgres
from tests.worker.conftest import LockHolder, run_in_thread, short_wait, stop_worker, wait_for

ME = OwnerId("host-a", 1, "nonce-1")


@contextmanager
def member_down(url: str, backend: str) -> Iterator[None]:
    """The store at ``url`` unreachable to a set that opened it: its SQLite file moved away, or its
    PostgreSQL schema renamed away (every statement then fails: its tables are gone); put back after."""
    if backend == "sqlite":
        path = url[len("sqlite:///"):]
        os.rename(path, path + ".gone")
        try:
            yield
        finally:
            os.rename(path + ".gone", path)
        return
    schema = url.rsplit("schema=", 1)[1]
    engine = create_engine(require_postgres(), poolclass=NullPool)

    def rename(old: str, new: str) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'ALTER SCHEMA "{old}" RENAME TO "{new}"')

    rename(schema, schema + "_away")
    try:
        yield
    finally:
        rename(schema + "_away", schema)
        engine.dispose()


def _placed_on(shards: fencepost.ShardSet, name: str, prefix: str, count: int = 1) -> list[str]:
    found = [f"{prefix}{i}" for i in range(1000) if shards.place(f"{prefix}{i}") == name]
    return found[:count]


def _owned(shards: fencepost.ShardSet, per_shard: int = 2) -> dict[str, list[str]]:
    """``per_shard`` runs on each shard, created and owned by ``ME``: their ids by shard."""
    ids = {name: _placed_on(shards, name, "r", per_shard) for name in shards.names}
    for group in ids.values():
        for rid in group:
            shards.runs.create(rid, "{}")
            shards.runs.claim_and_own(rid, RunSnapshot("pending", None, None), ME, shards.clock.now_ms())
    return ids


def _decisions(shards: fencepost.ShardSet, run_id: str) -> list[str]:
    return [e.payload.get("decision") for e in shards.journal.entries(run_id).entries
            if isinstance(e.payload, dict)]


# ---------------------------------------------------------------------- heartbeat_many


@pytest.mark.parametrize("failing_first", [True, False])
def test_heartbeat_many_writes_every_healthy_shard_and_names_the_failed_one(
        shard_urls: Callable[[int], list[str]], backend: str, failing_first: bool) -> None:
    urls = shard_urls(2)
    holder = LockHolder(urls[1], backend)
    try:
        with fencepost.open_shards([short_wait(u, backend) for u in urls]) as shards:
            ids = _owned(shards)
            healthy, failing = ids["shard-0"], ids["shard-1"]
            order = failing + healthy if failing_first else healthy + failing
            before = {rid: shards.runs.get(rid).heartbeat_at_ms for rid in failing}
            now = shards.clock.now_ms() + 5
            holder.hold()
            try:
                with pytest.raises(RunStoreError) as err:
                    shards.runs.heartbeat_many(ME, order, now)
            finally:
                holder.free()
            assert err.value.code == "persistence_failed"
            assert err.value.store == "shard-1"
            assert err.value.results == {rid: Updated(now) for rid in healthy}
            assert list(err.value.results) == [rid for rid in order if rid in healthy]  # request order
            assert {rid: shards.runs.get(rid).heartbeat_at_ms for rid in healthy} == dict.fromkeys(healthy, now)
            assert {rid: shards.runs.get(rid).heartbeat_at_ms for rid in failing} == before
            # Once the shard is back, one call renews all, as before.
            assert shards.runs.heartbeat_many(ME, order, now + 1) == {rid: Updated(now + 1) for rid in order}
    finally:
        holder.close()


def test_a_supervisor_over_shards_renews_the_healthy_shard_past_the_tolerance_of_the_failed_one(
        shard_urls: Callable[[int], list[str]], backend: str) -> None:
    """The failed shard's leases lapse at the write tolerance; the healthy shard's are renewed by
    every pulse, never reconfirmed (no ``lease-reconfirmed`` entry)."""
    urls = shard_urls(2)
    clock = ManualClock(1_000_000)
    holder = LockHolder(urls[1], backend)
    try:
        with fencepost.open_shards([short_wait(u, backend) for u in urls], clock=clock) as shards:
            ids = _owned(shards)
            sup = Supervisor(shards, ME)
            leases = {rid: sup.hold(rid) for group in ids.values() for rid in group}
            try:
                holder.hold()
                for _ in range(TOLERANCE_MS // INTERVAL_MS + 3):
                    clock.advance(INTERVAL_MS)
                    sup.settle()
            finally:
                holder.free()
                sup.stop()
            for rid in ids["shard-1"]:  # the outage was real, and outlasted the tolerance
                assert leases[rid].error is not None, rid
            for rid in ids["shard-0"]:
                assert leases[rid].error is None, rid
                assert leases[rid].reconfirmations == 0, rid
                assert "lease-reconfirmed" not in _decisions(shards, rid)
    finally:
        holder.close()


def test_a_worker_over_shards_keeps_renewing_the_healthy_shard_while_another_is_locked(
        shard_urls: Callable[[int], list[str]], backend: str, caplog: pytest.LogCaptureFixture) -> None:
    urls = shard_urls(2)
    holder = LockHolder(urls[1], backend)
    started: set[str] = set()
    release = threading.Event()

    def work(ctx: fencepost.worker.RunContext) -> dict[str, int]:
        started.add(ctx.run_id)
        while not release.is_set():
            ctx.check()
            time.sleep(0.05)
        return {"ok": 1}

    caplog.set_level(logging.WARNING, logger="fencepost.ownership")
    try:
        with fencepost.open_shards([short_wait(u, backend) for u in urls]) as shards:
            ids = {name: _placed_on(shards, name, "w", 2) for name in shards.names}
            for group in ids.values():
                for rid in group:
                    shards.runs.create(rid, "{}")
            stop = threading.Event()
            thread, outcome = run_in_thread(Worker(shards, work, concurrency=4), stop)
            try:
                assert wait_for(lambda: len(started) == 4, 20), started
                holder.hold()
                time.sleep(3.5)  # several heartbeat intervals, well within the write tolerance
                holder.free()
                time.sleep(1.5)  # a pulse that succeeds on both shards
                release.set()
                every = [rid for group in ids.values() for rid in group]
                assert wait_for(lambda: all(shards.runs.get(r).status == "completed" for r in every), 20)
            finally:
                release.set()
                holder.free()
                stop_worker(thread, stop, outcome, 20)
            failed = {r.run_id for r in caplog.records  # type: ignore[attr-defined]
                      if "heartbeat write failed" in r.getMessage()}
            assert set(ids["shard-1"]) <= failed  # the outage was real
            assert not failed & set(ids["shard-0"]), failed
            for rid in every:
                assert "lease-reconfirmed" not in _decisions(shards, rid)
    finally:
        holder.close()


# ---------------------------------------------------------------------- lookup with a member down


def test_a_run_on_a_healthy_shard_is_reached_while_its_placed_shard_is_down(
        shard_urls: Callable[[int], list[str]], backend: str) -> None:
    urls = shard_urls(2)
    with fencepost.open_shards(urls) as shards:
        [parent] = _placed_on(shards, "shard-0", "p")
        [child] = _placed_on(shards, "shard-1", "c")
        shards.runs.create(parent, "{}")
        shards.runs.create(child, "{}", parent_run_id=parent)
        assert shards.locate(child) == "shard-0"
        unknown = [_placed_on(shards, name, "u")[0] for name in shards.names]
    with fencepost.open_shards(urls) as shards, member_down(urls[1], backend):  # a fresh process: nothing known
        assert shards.runs.get(child).parent_run_id == parent
        shards.runs.request_cancel(child, shards.clock.now_ms())
        assert shards.runs.get(child).cancel_requested_at_ms is not None
        assert shards.locate(child) == "shard-0"
        assert shards.runs.get(parent).run_id == parent
        for rid in unknown:  # held by no shard that answered: the down shard may hold it
            with pytest.raises(FencepostError) as err:
                shards.runs.get(rid)
            assert err.value.code == "persistence_failed", err.value
            assert err.value.store == "shard-1", rid


# ---------------------------------------------------------------------- positions


def test_positions_name_the_shard_that_failed(shard_urls: Callable[[int], list[str]], backend: str) -> None:
    urls = shard_urls(3)
    with fencepost.open_shards(urls) as shards, member_down(urls[2], backend):
        with pytest.raises(FencepostError) as err:
            shards.positions()
        assert err.value.store == "shard-2"
        with pytest.raises(FencepostError) as err:
            list(shards.changes())
        assert err.value.store == "shard-2"
