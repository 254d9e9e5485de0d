"""Uses of the public API as the docs show them, for a type checker (``test_type_hints.py``); never run.

Each line must type-check as written: ``assert_type`` pins what a user's checker infers, and a
``# type: ignore[code]`` marks a misuse that must stay refused (mypy runs with
``--warn-unused-ignores``, so an ignore that is no longer needed fails too).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Generator
from typing import Any, assert_type

from sqlalchemy import Column, MetaData, Table, Text

import fencepost
from fencepost import Activated, Change, ChangePage, Claimed, OwnerId, RunStore, ShardChange, StopSignal, Store
from fencepost.projections import (
    CatchUp,
    NamedSources,
    OneSource,
    ProjectionBuilder,
    ProjectionStatus,
    RebuildRecord,
    RunsByStatus,
    Target,
)
from fencepost.worker import Worker


class Flag:
    """A stop signal of the user's own: anything with ``is_set()``."""

    def __init__(self) -> None:
        self.raised = False

    def is_set(self) -> bool:
        return self.raised


class Catalog:
    """A projection written as the custom-projection guide writes one: plain class attributes."""

    name = "catalog"
    feed = "runs"
    tables = (Table("catalog", MetaData(), Column("run_id", Text, primary_key=True)),)

    def reset(self, target: Target) -> None:
        target.conn.execute(target.table("catalog").delete())

    def apply(self, target: Target, update: Any) -> None:
        pass


def one_source(store: Store, url: str) -> int:
    assert_type(ProjectionBuilder(store, url, Catalog()).catch_up(), CatchUp)
    with ProjectionBuilder(store, url, RunsByStatus()) as builder:
        assert_type(builder, ProjectionBuilder[OneSource])
        done = builder.catch_up()
        assert_type(done, CatchUp)
        status = builder.status()
        assert_type(status, ProjectionStatus)
        assert_type(builder.rebuild(), CatchUp)
        assert_type(builder.rebuilds(), list[RebuildRecord])
        builder.catch_up().values()  # type: ignore[attr-defined]
        builder.rebuild("edge-1")  # type: ignore[arg-type]
        builder.run(Flag())
        builder.run(threading.Event())
        return done.applied + status.lag


def named_sources(stores: dict[str, Store], shards: fencepost.ShardSet, url: str) -> int:
    with ProjectionBuilder(stores, url, RunsByStatus()) as builder:
        assert_type(builder, ProjectionBuilder[NamedSources])
        done = builder.catch_up()
        assert_type(done, dict[str, CatchUp])
        assert_type(builder.rebuild("edge-1"), dict[str, CatchUp])
        assert_type(builder.rebuilds(), dict[str, list[RebuildRecord]])
        print(builder.catch_up().applied)  # type: ignore[attr-defined]
    sharded = ProjectionBuilder(shards, url, RunsByStatus())
    assert_type(sharded.status(), dict[str, ProjectionStatus])
    return sum(d.applied for d in done.values())


def either(source: Store | dict[str, Store], url: str) -> None:
    """A source known only as one or the other gives either result."""
    builder = ProjectionBuilder(source, url, RunsByStatus())
    assert_type(builder.catch_up(), CatchUp | dict[str, CatchUp])


def stop_signals(store: Store, shards: fencepost.ShardSet) -> None:
    flag: StopSignal = Flag()
    for signal in (flag, threading.Event(), asyncio.Event(), None):
        follow = store.feed.follow(stop=signal)
        assert_type(follow, Generator[Change, None, None])
        follow.close()
        pages = store.feed.follow_batches(stop=signal)
        assert_type(pages, Generator[ChangePage, None, None])
        merged = shards.follow({"edge-1": None}, stop=signal)  # a shard at None starts at revision 0
        assert_type(merged, Generator[ShardChange, None, None])
        Worker(store, lambda ctx: None).run(signal)
    store.feed.follow(stop=True)  # type: ignore[arg-type]
    positions: dict[str, fencepost.Position | None] = {"edge-1": None}
    assert_type(next(shards.changes(positions)), ShardChange)


async def tail(store: Store) -> list[str]:
    changes = store.feed.afollow(stop=asyncio.Event())
    assert_type(changes, AsyncGenerator[Change, None])
    seen: list[str] = []
    async for change in changes:
        seen.append(change.run_id)
        break
    await changes.aclose()
    return seen


def outcomes(store: Store, me: OwnerId) -> bool:
    row = store.runs.get("invoice-42")
    claim = store.runs.claim("invoice-42", row.snapshot(), me, store.clock.now_ms())
    assert isinstance(claim, Claimed)
    claim.claimed_at_ms = 0  # type: ignore[misc]  # outcomes are frozen
    activated = store.runs.activate("invoice-42", me, claim.claimed_at_ms, row)
    assert_type(store.runs, RunStore)
    return isinstance(activated, Activated)


def memory_store_clock() -> None:
    """``fencepost.testing.memory_store()`` runs on a ``ManualClock`` a test advances through the
    store (the module's own example), also inside ``with``; a clock of one's own keeps its type."""
    from fencepost.clock import ManualClock, SystemClock
    from fencepost.testing import MemoryStore, memory_store

    with memory_store() as store:
        assert_type(store.clock, ManualClock)
        store.clock.advance(31_000)
        store.runs.create("run-1", "{}")
    with memory_store(clock=ManualClock(5)) as manual:
        assert_type(manual.clock, ManualClock)
    with memory_store(clock=SystemClock()) as system:
        assert_type(system.clock, SystemClock)
        system.clock.advance(1)  # type: ignore[attr-defined]
    plain: MemoryStore[ManualClock] = memory_store()
    plain.close()
    shared: Store = memory_store()  # still a Store wherever one is wanted
    shared.close()
