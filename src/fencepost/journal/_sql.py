"""Journal statements: module-level Core objects, run through the driver's own cursor.

The append path runs two or three statements per entry inside a write transaction that already
holds the writer lock. SQLAlchemy's per-execute overhead would dominate that path, so each
statement is compiled once per dialect (the SQL text still comes from Core, so both backends run the
same statement) and executed on the DB-API connection underneath the SQLAlchemy ``Connection``,
inside the same transaction. Driver errors are wrapped back into SQLAlchemy's ``DBAPIError`` so the
durable writer classifies and retries them exactly as it does for its own statements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, func, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement

from fencepost._schema import flows_journal_events as ev


class Prepared:
    """A Core statement compiled once per dialect, executed on the raw DB-API connection."""

    def __init__(self, stmt: ClauseElement) -> None:
        self.stmt = stmt
        self._compiled: dict[str, tuple[str, tuple[str, ...] | None, dict[str, Any]]] = {}

    def _for(self, conn: Connection) -> tuple[str, tuple[str, ...] | None, dict[str, Any]]:
        name = conn.dialect.name
        found = self._compiled.get(name)
        if found is None:
            compiled = self.stmt.compile(dialect=conn.dialect)
            order = tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
            # compiled.params lists every bind; only those with a value (LIMIT 1 ...) are defaults.
            defaults = {k: v for k, v in compiled.params.items() if v is not None}
            found = (str(compiled), order, defaults)
            self._compiled[name] = found
        return found

    def _bind(self, order: tuple[str, ...] | None, defaults: dict[str, Any], params: Mapping[str, Any]) -> Any:
        if order is None:
            return {**defaults, **params} if defaults else params
        if not defaults:
            return tuple(map(params.__getitem__, order))
        return tuple(params[n] if n in params else defaults[n] for n in order)

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Run the statement with ``params`` and return every row (empty for DML)."""
        sql, order, defaults = self._for(conn)
        bound = self._bind(order, defaults, params)
        raw = conn.connection.driver_connection
        try:
            cur = raw.cursor()
            try:
                cur.execute(sql, bound)
                return cur.fetchall() if cur.description is not None else []
            finally:
                cur.close()
        except conn.dialect.loaded_dbapi.Error as exc:
            raise _wrap(conn, sql, exc) from None

    def execute_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run a DML statement once per parameter set in ``rows``."""
        sql, order, defaults = self._for(conn)
        bound = [self._bind(order, defaults, r) for r in rows]
        raw = conn.connection.driver_connection
        try:
            cur = raw.cursor()
            try:
                cur.executemany(sql, bound)
            finally:
                cur.close()
        except conn.dialect.loaded_dbapi.Error as exc:
            raise _wrap(conn, sql, exc) from None


def _wrap(conn: Connection, sql: str, exc: BaseException) -> DBAPIError:
    # hide_parameters: bound values are journal payloads and never belong in an error.
    return DBAPIError.instance(
        sql, None, exc, conn.dialect.loaded_dbapi.Error, hide_parameters=True, dialect=conn.dialect
    )  # type: ignore[return-value]


_run = bindparam("run_id")
_source = bindparam("source_id")

# Every head the allocator needs, in one round trip: the stream's last (seq, hash), the log's last
# (position, hash) and the producer's highest source_seq. All are index lookups.
HEADS = Prepared(
    select(
        select(ev.c.seq).where(ev.c.run_id == _run).order_by(ev.c.seq.desc()).limit(1).scalar_subquery(),
        select(ev.c.entry_hash).where(ev.c.run_id == _run).order_by(ev.c.seq.desc()).limit(1).scalar_subquery(),
        select(ev.c.position).order_by(ev.c.position.desc()).limit(1).scalar_subquery(),
        select(ev.c.entry_hash).order_by(ev.c.position.desc()).limit(1).scalar_subquery(),
        select(func.max(ev.c.source_seq)).where(ev.c.run_id == _run, ev.c.source_id == _source).scalar_subquery(),
    )
)

EXISTING = Prepared(
    select(ev.c.seq, ev.c.position, ev.c.content_hash, ev.c.event_type, ev.c.payload_json, ev.c.meta_json).where(
        ev.c.run_id == _run, ev.c.source_id == _source, ev.c.source_seq == bindparam("source_seq")
    )
)

INSERT = Prepared(insert(ev).values({c.name: bindparam(c.name) for c in ev.c}))

ENTRY_COLUMNS = (
    ev.c.run_id, ev.c.seq, ev.c.event_id, ev.c.source_id, ev.c.source_seq, ev.c.emitted_at_ms,
    ev.c.event_type, ev.c.payload_json, ev.c.meta_json, ev.c.position, ev.c.entry_hash,
)
