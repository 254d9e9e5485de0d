"""Journal statements: module-level Core objects, run through the driver's own cursor.

The append path runs two or three statements per entry inside a write transaction that already
holds the writer lock. SQLAlchemy's per-execute overhead would dominate that path, so each
statement is a ``fencepost._statements.Sql``: compiled once per dialect (the SQL text still comes
from Core, so both backends run the same statement) and executed on the DB-API connection
underneath the SQLAlchemy ``Connection``, inside the same transaction, like the run store's.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BindParameter, Select, bindparam, insert, select

from fencepost._schema import flows_journal_events as ev
from fencepost._statements import Sql

_run: BindParameter[str] = bindparam("run_id")
_source: BindParameter[str] = bindparam("source_id")

# Every head the allocator needs, in one round trip: the stream's last (seq, hash), the log's last
# (position, hash) and the producer's highest source_seq. Each reads one index entry, written as
# "the last in index order" so no planner can turn one into a scan of the stream.
def heads_select(*extra: Any) -> Select[Any]:
    """The head lookup as a Core select, with ``extra`` columns after the five heads."""
    return select(
        select(ev.c.seq).where(ev.c.run_id == _run).order_by(ev.c.seq.desc()).limit(1).scalar_subquery(),
        select(ev.c.entry_hash).where(ev.c.run_id == _run).order_by(ev.c.seq.desc()).limit(1).scalar_subquery(),
        select(ev.c.position).order_by(ev.c.position.desc()).limit(1).scalar_subquery(),
        select(ev.c.entry_hash).order_by(ev.c.position.desc()).limit(1).scalar_subquery(),
        # Not ``max()``: PostgreSQL's planner, without statistics for the table (one written faster
        # than autovacuum analyses it), ran that aggregate over every entry of the producer on the
        # run. ``source_seq`` is NOT NULL, so the last in index order is the highest.
        select(ev.c.source_seq).where(ev.c.run_id == _run, ev.c.source_id == _source)
        .order_by(ev.c.source_seq.desc()).limit(1).scalar_subquery(),
        *extra,
    )


HEADS = Sql(heads_select())

EXISTING = Sql(
    select(ev.c.seq, ev.c.position, ev.c.content_hash, ev.c.event_type, ev.c.payload_json, ev.c.meta_json).where(
        ev.c.run_id == _run, ev.c.source_id == _source, ev.c.source_seq == bindparam("source_seq")
    )
)

#: The insert's parameters, in the order ``append_prepared`` gives their values.
INSERT_FIELDS = tuple(c.name for c in ev.c)
# Fourteen parameters: bound by position on SQLite, given as a tuple (see ``Sql``).
INSERT = Sql(insert(ev).values({c.name: bindparam(c.name) for c in ev.c}), by_position=True, fields=INSERT_FIELDS)

ENTRY_COLUMNS = (
    ev.c.run_id, ev.c.seq, ev.c.event_id, ev.c.source_id, ev.c.source_seq, ev.c.emitted_at_ms,
    ev.c.event_type, ev.c.payload_json, ev.c.meta_json, ev.c.position, ev.c.entry_hash,
)
