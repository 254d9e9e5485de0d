"""Checkpoints and the rebuild log, as the builder reads and writes them on the target.

Every write here runs inside the same target transaction as the updates it accounts for, and
is a compare-and-swap on the position that transaction was computed from: a second writer that
slipped past the builder lock finds the checkpoint moved and applies nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec
from sqlalchemy import and_, bindparam, update
from sqlalchemy.engine import Connection

from fencepost.projections import _sql
from fencepost.projections._sql import checkpoints as cp_table

RebuildReason = str  # "source_changed" | "source_rewound" | "journal_diverged" | "requested"


class Checkpoint(msgspec.Struct, frozen=True):
    """The durable state of one projection on its target.

    ``source``/``revision`` is what the live tables reflect (``None`` before the first page);
    ``shadow_*`` is set only while a rebuild is filling the shadow copy.
    """

    name: str
    feed: str
    source: str | None
    revision: int
    anchor: str | None
    applied: int
    rejected: int
    rebuilds: int
    shadow_source: str | None
    shadow_revision: int | None
    shadow_anchor: str | None
    shadow_applied: int | None
    shadow_reason: str | None
    shadow_started_at_ms: int | None
    updated_at_ms: int


class RebuildRecord(msgspec.Struct, frozen=True):
    """One completed rebuild: why, from which applied position, to which one."""

    reason: str
    from_source: str | None
    from_revision: int | None
    to_source: str
    to_revision: int
    applied: int
    started_at_ms: int
    finished_at_ms: int


class CheckpointMoved(Exception):
    """Internal: the checkpoint is not where this transaction expected it (someone else moved it)."""


def _row_to_checkpoint(row: Any) -> Checkpoint:
    m = row._mapping
    return Checkpoint(**{f: m[f] for f in Checkpoint.__struct_fields__})


def load(conn: Connection, name: str) -> Checkpoint | None:
    """The checkpoint of ``name``, or None."""
    row = conn.execute(_sql.load_checkpoint, {"name": name}).first()
    return None if row is None else _row_to_checkpoint(row)


def ensure(conn: Connection, backend: Any, name: str, feed: str, now_ms: int, *,
           share: tuple[str, str] | None = None) -> Checkpoint:
    """Create the checkpoint row of ``name`` if absent and return it.

    ``share`` is ``(projection, source name)`` for the checkpoint of one source's share of a
    projection fed by several sources; it is recorded with the row (migration 3002).
    """
    values: dict[str, Any] = {
        "name": name, "feed": feed, "source": None, "revision": 0, "anchor": None, "applied": 0,
        "rejected": 0, "rebuilds": 0, "updated_at_ms": now_ms,
    }
    if share is not None:
        values["projection"], values["source_name"] = share
    conn.execute(backend.insert(cp_table).values(**values).on_conflict_do_nothing(index_elements=["name"]))
    found = load(conn, name)
    assert found is not None
    return found


def share_of(conn: Connection, name: str) -> tuple[str, str] | None:
    """``(projection, source name)`` when the row ``name`` is one source's share, else None."""
    row = conn.execute(_sql.share_of, {"name": name}).first()
    return None if row is None or row.projection is None else (row.projection, row.source_name)


def has_shares(conn: Connection, projection: str) -> bool:
    """True when some source's share of ``projection`` has a checkpoint row on this target."""
    return conn.execute(_sql.any_share, {"projection": projection}).first() is not None


def _where_shadow(cp: Checkpoint) -> Any:
    c = cp_table.c
    return and_(c.name == cp.name, c.shadow_source == cp.shadow_source, c.shadow_revision == cp.shadow_revision)


# The per-page compare-and-swaps, built once (SQLAlchemy then compiles each once): a statement
# built per page costs more than the UPDATE itself.
_c = cp_table.c
_ADVANCE_SET = {
    "revision": bindparam("to_revision"), "anchor": bindparam("to_anchor"),
    "applied": _c.applied + bindparam("add_applied"), "rejected": _c.rejected + bindparam("add_rejected"),
    "updated_at_ms": bindparam("now_ms"),
}
_LIVE_AT = and_(_c.name == bindparam("cp_name"), _c.revision == bindparam("cp_revision"), _c.shadow_source.is_(None))
_ADVANCE_LIVE = update(cp_table).where(_LIVE_AT, _c.source == bindparam("cp_source")).values(
    source=bindparam("to_source"), **_ADVANCE_SET)
_ADVANCE_FIRST = update(cp_table).where(_LIVE_AT, _c.source.is_(None)).values(
    source=bindparam("to_source"), **_ADVANCE_SET)
_ADVANCE_SHADOW = update(cp_table).where(
    _c.name == bindparam("cp_name"), _c.shadow_source == bindparam("cp_shadow_source"),
    _c.shadow_revision == bindparam("cp_shadow_revision"),
).values(
    shadow_revision=bindparam("to_revision"), shadow_anchor=bindparam("to_anchor"),
    shadow_applied=_c.shadow_applied + bindparam("add_applied"), applied=_c.applied + bindparam("add_applied"),
    rejected=_c.rejected + bindparam("add_rejected"), updated_at_ms=bindparam("now_ms"),
)


def advance_live(conn: Connection, cp: Checkpoint, *, source: str, revision: int, anchor: str | None,
                 applied: int, rejected: int, now_ms: int) -> None:
    """Move the live checkpoint from ``cp`` to ``(source, revision)``; raise CheckpointMoved if it moved."""
    params = {"cp_name": cp.name, "cp_revision": cp.revision, "to_source": source, "to_revision": revision,
              "to_anchor": anchor, "add_applied": applied, "add_rejected": rejected, "now_ms": now_ms}
    if cp.source is None:
        # A page that consumed nothing (an empty feed) leaves the source unrecorded: at revision 0
        # the projection reflects no source yet, as one never built.
        result = conn.execute(_ADVANCE_FIRST, {**params, "to_source": source if revision > 0 else None})
    else:
        result = conn.execute(_ADVANCE_LIVE, {**params, "cp_source": cp.source})
    if result.rowcount != 1:
        raise CheckpointMoved()


def start_shadow(conn: Connection, cp: Checkpoint, *, source: str, reason: str, now_ms: int) -> None:
    """Begin (or restart) filling the shadow copy from revision 0 of ``source``."""
    c = cp_table.c
    src = c.source.is_(None) if cp.source is None else c.source == cp.source
    result = conn.execute(
        update(cp_table).where(and_(c.name == cp.name, src, c.revision == cp.revision)).values(
            shadow_source=source, shadow_revision=0, shadow_anchor=None, shadow_applied=0,
            shadow_reason=reason, shadow_started_at_ms=now_ms, updated_at_ms=now_ms,
        )
    )
    if result.rowcount != 1:
        raise CheckpointMoved()


def restart(conn: Connection, cp: Checkpoint, *, now_ms: int) -> None:
    """Move ``cp`` back to before its first page (no source, revision 0, no shadow): the projection
    is built again from the start. The totals are kept."""
    c = cp_table.c
    src = c.source.is_(None) if cp.source is None else c.source == cp.source
    result = conn.execute(
        update(cp_table).where(and_(c.name == cp.name, src, c.revision == cp.revision)).values(
            source=None, revision=0, anchor=None, shadow_source=None, shadow_revision=None, shadow_anchor=None,
            shadow_applied=None, shadow_reason=None, shadow_started_at_ms=None, updated_at_ms=now_ms,
        )
    )
    if result.rowcount != 1:
        raise CheckpointMoved()


def advance_shadow(conn: Connection, cp: Checkpoint, *, revision: int, anchor: str | None, applied: int,
                   rejected: int, now_ms: int) -> None:
    """Move the shadow checkpoint from ``cp`` to ``revision``; raise CheckpointMoved if it moved."""
    result = conn.execute(_ADVANCE_SHADOW, {
        "cp_name": cp.name, "cp_shadow_source": cp.shadow_source, "cp_shadow_revision": cp.shadow_revision,
        "to_revision": revision, "to_anchor": anchor, "add_applied": applied, "add_rejected": rejected,
        "now_ms": now_ms,
    })
    if result.rowcount != 1:
        raise CheckpointMoved()


def swap_shadow(conn: Connection, cp: Checkpoint, *, now_ms: int) -> RebuildRecord:
    """Make the shadow position the live one, clear the shadow state and log the rebuild."""
    assert cp.shadow_source is not None and cp.shadow_revision is not None and cp.shadow_reason is not None
    result = conn.execute(
        update(cp_table).where(_where_shadow(cp)).values(
            source=cp.shadow_source, revision=cp.shadow_revision, anchor=cp.shadow_anchor,
            rebuilds=cp_table.c.rebuilds + 1,
            shadow_source=None, shadow_revision=None, shadow_anchor=None, shadow_applied=None,
            shadow_reason=None, shadow_started_at_ms=None, updated_at_ms=now_ms,
        )
    )
    if result.rowcount != 1:
        raise CheckpointMoved()
    record = RebuildRecord(
        reason=cp.shadow_reason, from_source=cp.source, from_revision=cp.revision if cp.source else None,
        to_source=cp.shadow_source, to_revision=cp.shadow_revision, applied=cp.shadow_applied or 0,
        started_at_ms=cp.shadow_started_at_ms or now_ms, finished_at_ms=now_ms,
    )
    conn.execute(_sql.rebuilds.insert().values(name=cp.name, **msgspec.structs.asdict(record)))
    return record


def last_rebuild(conn: Connection, name: str) -> RebuildRecord | None:
    """The most recent completed rebuild of ``name``, or None."""
    row = conn.execute(_sql.last_rebuild, {"name": name}).first()
    if row is None:
        return None
    m = row._mapping
    return RebuildRecord(**{f: m[f] for f in RebuildRecord.__struct_fields__})


def rebuild_log(conn: Connection, name: str) -> list[RebuildRecord]:
    """Every completed rebuild of ``name``, oldest first."""
    t = _sql.rebuilds
    rows = conn.execute(t.select().where(t.c.name == name).order_by(t.c.rebuild_id))
    return [RebuildRecord(**{f: r._mapping[f] for f in RebuildRecord.__struct_fields__}) for r in rows]
