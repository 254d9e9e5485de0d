"""Projections known to a target only by what the builder recorded there: checkpoint and tables.

A reader that did not build a projection and has no ``Projection`` object for it (the console)
still gets the figures ``ProjectionBuilder.status()`` computes, from the same code: it hands the
builder a stand-in carrying the projection's name, feed kind and the live tables the builder
recorded as its own (``projection_tables``), so the "a table of the projection was dropped" check
looks at the tables that exist, not at invented ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Column, MetaData, Table, Text, select

from fencepost._migrations import pending
from fencepost.projections import _sql
from fencepost.projections._sources import SOURCE_COLUMN

if TYPE_CHECKING:
    from fencepost._durable import Database


class Recorded:
    """A projection seen through its records on the target: never reset or applied, only read.

    ``tables`` are the live tables recorded for it; ``None`` when the target predates that record,
    and then ``status()`` cannot tell whether a table was dropped (it says nothing about it).
    """

    def __init__(self, name: str, feed: str, tables: list[str] | None, sources: list[str] | None = None) -> None:
        self.name = name
        self.feed = feed
        self.tables_recorded = tables is not None
        #: The source names of a projection fed by several stores (one checkpoint each), else None.
        self.sources = sources
        md = MetaData()
        # A stand-in table when none is recorded: the builder needs one, and with
        # ``tables_recorded`` False its status does not look for it. Fed by several stores, its
        # stand-in tables are keyed by source as the builder requires of such a projection's.
        keys = [Column(SOURCE_COLUMN, Text, primary_key=True)] if sources is not None else []
        self.tables = [Table(t, md, *[k.copy() for k in keys], Column("k", Text, primary_key=True))
                       for t in (tables or [f"{name}__unknown"])]

    def reset(self, target: Any) -> None:  # pragma: no cover - a stand-in never applies
        raise NotImplementedError

    def apply(self, target: Any, update: Any) -> None:  # pragma: no cover
        raise NotImplementedError


def checkpointed(target: Database) -> list[Recorded]:
    """Each single-source projection with a checkpoint on ``target``, by name (read-only).

    A source's share of a projection fed by several stores is left out: its position is measured
    against that store, which ``target`` may not be. Empty when the builder's tables are not there.
    """
    waiting = {m.id for m in pending(target, ("projections",))}
    if 3001 in waiting:
        return []
    cp = _sql.checkpoints.c
    stmt = select(cp.name, cp.feed).order_by(cp.name)
    if 3002 not in waiting:
        stmt = stmt.where(cp.projection.is_(None))

    def body(conn: Any) -> tuple[list[tuple[str, str]], dict[str, list[str]] | None]:
        return [(str(n), str(f)) for n, f in conn.execute(stmt)], _kept(conn, waiting)

    found, kept = target.read(body)
    return [Recorded(name, feed, None if kept is None else _live(kept.get(name, []))) for name, feed in found]


def fed_by_several(target: Database) -> list[Recorded]:
    """Each projection fed by several stores with a checkpoint on ``target``, by name, with the
    source names of its checkpoints (read-only). Empty when the target records no source shares."""
    waiting = {m.id for m in pending(target, ("projections",))}
    if 3001 in waiting or 3002 in waiting:
        return []
    cp = _sql.checkpoints.c
    stmt = (select(cp.projection, cp.source_name, cp.feed).where(cp.projection.is_not(None))
            .order_by(cp.projection, cp.source_name))

    def body(conn: Any) -> tuple[list[tuple[str, str, str]], dict[str, list[str]] | None]:
        return [(str(p), str(s), str(f)) for p, s, f in conn.execute(stmt)], _kept(conn, waiting)

    found, kept = target.read(body)
    shares: dict[str, tuple[str, list[str]]] = {}
    for projection, source, feed in found:
        shares.setdefault(projection, (feed, []))[1].append(source)
    return [Recorded(name, feed, None if kept is None else _live(kept.get(name, [])), sources)
            for name, (feed, sources) in shares.items()]


def _kept(conn: Any, waiting: set[int]) -> dict[str, list[str]] | None:
    """The tables recorded as each projection's (live and shadow), by projection name; None when
    the target predates that record (migration 3004)."""
    if 3004 in waiting:
        return None
    owners = _sql.table_owners.c
    kept: dict[str, list[str]] = {}
    for table, projection in conn.execute(select(owners.table_name, owners.projection)):
        kept.setdefault(str(projection), []).append(str(table))
    return kept


def _live(recorded: list[str]) -> list[str] | None:
    """The live tables among a projection's recorded ones (each recorded with its ``__shadow`` copy)."""
    names = set(recorded)
    live = sorted(n for n in names if f"{n}__shadow" in names)
    return live or None
