"""What a builder reads from: one unnamed store, or several named stores, each feeding its share.

A projection fed by several stores keeps one checkpoint per source on the target. Each source's
share is an ordinary checkpoint row named ``<projection>@<source name>`` (migration 3002 records
whose share it is), so paging, held revisions, shadow progress, rebuild log and compare-and-swap
work per source exactly as they work for a single source, and revisions of two sources never meet.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table

from fencepost.errors import ProjectionError
from fencepost.projections._feeds import ConsensusFeed, RunsFeed

if TYPE_CHECKING:
    from fencepost._store import Store

SOURCE_COLUMN = "source_name"  # every table of a projection fed by several sources keys on it
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_NAME_RULE = "must be 1..64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"


class Share:
    """One source of a builder: its store and feed, and the checkpoint row its pages advance.

    ``label`` is the source's name, or None for the single unnamed source (whose checkpoint row is
    the projection's own name, as it always was).
    """

    __slots__ = ("checkpoint", "feed", "label", "shadow_marker", "store", "turn")

    def __init__(self, projection: str, label: str | None, store: Store, feed_kind: str) -> None:
        self.label = label
        self.store = store
        self.feed: RunsFeed | ConsensusFeed = ConsensusFeed(store) if feed_kind == "consensus" else RunsFeed(store)
        self.checkpoint = projection if label is None else checkpoint_name(projection, label)
        # Marker of the transaction of the last shadow page this builder committed for this share.
        self.shadow_marker: int | None = None
        # The one pass (a ``catch_up``, a ``rebuild``, a pass of ``run``) that works on this share
        # at a time, whichever thread it runs on.
        self.turn = Turn()


class Turn:
    """Who works on a share: one pass at a time (re-entrant for its thread), and a caller's
    ``catch_up`` or ``rebuild`` goes before the follow loop's next pass, so it waits for the pass
    under way only, never for a loop that keeps finding something new to apply."""

    __slots__ = ("_callers", "_count", "_held")

    def __init__(self) -> None:
        self._held = threading.RLock()
        self._count = threading.Lock()
        self._callers = 0  # calls waiting for their turn or holding it

    def take(self, give_up: Callable[[], bool], *, caller: bool) -> bool:
        """Wait for the turn and hold it (True), checking ``give_up`` every 50 ms: once it holds,
        return False without the turn (it may raise instead). A loop's pass (``caller`` False)
        waits while a caller waits."""
        if caller:
            with self._count:
                self._callers += 1
        try:
            while True:
                if caller or self._callers == 0:
                    if self._held.acquire(timeout=0.05):
                        return True
                else:
                    time.sleep(0.05)
                if give_up():
                    return False
        finally:
            if caller:
                with self._count:
                    self._callers -= 1

    def release(self) -> None:
        self._held.release()


def checkpoint_name(projection: str, label: str) -> str:
    """The checkpoint row of source ``label``'s share of ``projection``."""
    return f"{projection}@{label}"


def _refuse(detail: str, method: str = "ProjectionBuilder") -> ProjectionError:
    return ProjectionError("invalid_sources", method, f"sources: {detail}")


# A closed source store: refused before the target is touched (reading it would fail only after
# the target and its lock file were made, with the store's own error).
CLOSED = "the store is closed (open it again, or make the builder before closing it)"


def refuse_closed(shares: list[Share], method: str, only: Share | None = None) -> None:
    """Raise ``invalid_sources`` when a source's store (``only``'s, when given) was closed, naming
    it by its position among ``shares``."""
    for index, share in enumerate(shares):
        if (only is None or share is only) and share.store.db.closed:
            raise _refuse(CLOSED if share.label is None else f"source #{index}: {CLOSED}", method)


def _database_key(store: Store) -> tuple[Any, ...]:
    """Where a store's database lives: two stores with one key are the same source twice."""
    db = store.db
    if db.path is not None:
        return ("sqlite", os.path.realpath(db.path))
    url = db.engine.url
    return ("postgresql", url.host, url.port, url.database, db.schema)


def resolve(sources: object) -> dict[str, Store] | None:
    """None for one unnamed ``Store``; else the checked ``{name: store}`` mapping, in its order.

    Accepts a ``Mapping`` of names to stores or a ``ShardSet`` (its shards by name). Refuses, with
    ``ProjectionError('invalid_sources')`` naming the rule and the position (never a name or URL):
    anything else, an empty mapping, a name outside the shard-name rule, a value that is not a
    ``Store``, and one database given twice (the same store, or two stores opened on it).
    """
    from fencepost._store import Store
    from fencepost.shards import ShardSet

    if isinstance(sources, Store):
        if sources.db.closed:
            raise _refuse(CLOSED)
        return None
    if isinstance(sources, ShardSet):
        sources = dict(sources.items())
    if not isinstance(sources, Mapping):
        raise _refuse("must be a Store or a mapping of source names to Stores")
    if not sources:
        raise _refuse("the mapping must name at least one store")
    named: dict[str, Store] = {}
    seen: dict[tuple[Any, ...], int] = {}
    for index, (name, store) in enumerate(sources.items()):
        if type(name) is not str or not _NAME.match(name):
            raise _refuse(f"source #{index} name {_NAME_RULE}")
        if not isinstance(store, Store):
            raise _refuse(f"source #{index} must be a fencepost Store")
        if store.db.closed:
            raise _refuse(f"source #{index}: {CLOSED}")
        key = _database_key(store)
        if key in seen:
            raise _refuse(f"source #{index} is the database of source #{seen[key]} again")
        seen[key] = index
        named[name] = store
    return named


def keyed_by_source(tables: list[Table]) -> bool:
    """True when every table has the source-name column in its primary key."""
    return all(SOURCE_COLUMN in t.primary_key.columns for t in tables)
