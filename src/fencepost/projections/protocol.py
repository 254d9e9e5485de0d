"""What a projection is: its tables, how to empty them, how to apply one update.

A projection never sees checkpoints, shadows or stale updates: the builder decides which updates
are newer (REFERENCE 4 "Projection contract") and hands each accepted one to ``apply`` inside the
target transaction that also advances the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec
from sqlalchemy import Table
from sqlalchemy.engine import Connection

from fencepost._dialects import Backend

FeedKind = Literal["runs", "consensus"]


class ConsensusFact(msgspec.Struct, frozen=True):
    """One ``flows.consensus.*`` journal fact, as a consensus-fed projection receives it.

    ``revision`` is the fact's global journal position and ``source`` the database's source id, so
    facts obey the same ``is_newer`` rule as run snapshots.
    """

    run_id: str
    source: str
    revision: int
    kind: str
    owner: dict[str, Any] | None
    granted_at_ms: int | None
    emitted_at_ms: int


class Target:
    """The target side of one transaction: the connection and the tables to write.

    ``tables`` maps each declared (live) table name to the table this transaction writes: the live
    table during catch-up, its shadow copy while a rebuild fills one. ``shadow`` says which.
    ``source_name`` is the name of the source whose updates this transaction applies when the
    builder is fed by several named sources (write it into every row's ``source_name`` key column);
    None for a single unnamed source.
    """

    __slots__ = ("backend", "conn", "shadow", "source_name", "tables")

    def __init__(self, conn: Connection, backend: Backend, tables: Mapping[str, Table], shadow: bool,
                 source_name: str | None = None) -> None:
        self.conn = conn
        self.backend = backend
        self.tables = tables
        self.shadow = shadow
        self.source_name = source_name

    def table(self, name: str) -> Table:
        """The table to write for the declared table ``name``."""
        return self.tables[name]

    def insert(self, table: Table) -> Any:
        """A dialect INSERT for ``table`` that offers ``on_conflict_do_update`` on both backends."""
        return self.backend.insert(table)


@runtime_checkable
class Projection(Protocol):
    """A read model kept by a ``ProjectionBuilder``.

    ``name`` identifies it on its target (one checkpoint per name); ``feed`` is ``"runs"`` (run
    snapshots: ``Observed`` / ``Missing`` from the change feed) or ``"consensus"`` (``ConsensusFact``
    from the journal, in global position order). ``tables`` are created on the target if absent,
    together with a shadow copy of each for rebuilds. ``reset`` empties them; ``apply`` applies one
    accepted update. An optional ``apply_batch(target, updates)`` may apply a whole page at once; it
    must give the same result as calling ``apply`` for each update in order.

    Fed by several named sources, every table must have a ``source_name`` column in its primary key
    and ``apply`` writes ``target.source_name`` there; the builder then empties one source's rows
    itself (``reset`` is not called). A projection that can switch to that shape offers an optional
    ``keyed_by_source()`` returning the keyed copy, which the builder calls when given several sources.
    """

    # Read-only members, so plain class attributes satisfy them (``feed = "runs"``, a tuple of tables);
    # the builder checks the values when it is constructed (``feed`` must be ``"runs"`` or ``"consensus"``).
    @property
    def name(self) -> str: ...

    @property
    def feed(self) -> str: ...

    @property
    def tables(self) -> Sequence[Table]: ...

    def reset(self, target: Target) -> None:
        """Remove every row this projection keeps in ``target.tables``."""
        ...

    def apply(self, target: Target, update: Any) -> None:
        """Apply one update the builder has accepted as newer than what the projection holds."""
        ...
