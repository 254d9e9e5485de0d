"""The builder's own tables on the target (migration 3001) and the statements built from them.

Statements are module-level Core objects with bind parameters, so SQLAlchemy compiles each once.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Column, Integer, MetaData, Select, Table, Text, TextClause, bindparam, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import Executable, Insert

from fencepost._dialects import Backend, in_json_ids, statement_cache

if TYPE_CHECKING:
    from fencepost.projections._shadow import ShadowTables

metadata = MetaData()

Int = BigInteger().with_variant(Integer(), "sqlite")

checkpoints = Table(
    "projection_checkpoints",
    metadata,
    Column("name", Text, primary_key=True),
    Column("feed", Text, nullable=False),
    Column("source", Text),
    Column("revision", Int, nullable=False),
    Column("anchor", Text),
    Column("applied", Int, nullable=False),
    Column("rejected", Int, nullable=False),
    Column("rebuilds", Int, nullable=False),
    Column("shadow_source", Text),
    Column("shadow_revision", Int),
    Column("shadow_anchor", Text),
    Column("shadow_applied", Int),
    Column("shadow_reason", Text),
    Column("shadow_started_at_ms", Int),
    Column("updated_at_ms", Int, nullable=False),
    # Migration 3002: set (both) on the checkpoint of one source's share of a projection fed by
    # several sources; NULL on an ordinary projection's checkpoint.
    Column("projection", Text),
    Column("source_name", Text),
)

rebuilds = Table(
    "projection_rebuilds",
    metadata,
    Column("rebuild_id", Int, primary_key=True, autoincrement=True),
    Column("name", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("from_source", Text),
    Column("from_revision", Int),
    Column("to_source", Text, nullable=False),
    Column("to_revision", Int, nullable=False),
    Column("applied", Int, nullable=False),
    Column("started_at_ms", Int, nullable=False),
    Column("finished_at_ms", Int, nullable=False),
)


# Migration 3004: which projection keeps each table (live and shadow) on the target.
table_owners = Table(
    "projection_tables",
    metadata,
    Column("table_name", Text, primary_key=True),
    Column("projection", Text, nullable=False),
)


def _revisions_table(name: str) -> Table:
    return Table(
        name,
        metadata,
        Column("name", Text, primary_key=True),
        Column("run_id", Text, primary_key=True),
        Column("source", Text, nullable=False),
        Column("revision", Int, nullable=False),
        sqlite_with_rowid=False,  # migration 3003
    )


run_revisions = _revisions_table("projection_run_revisions")
run_revisions_shadow = _revisions_table("projection_run_revisions_shadow")

# Table names a projection may not declare: the store's tables (and any later ``flows_`` table) and
# the builder's own, on a target that may be the store's own database.
RESERVED_PREFIX = "flows_"
SWAP_PARKING = "fencepost_projection_swap"  # a live table's name for the moment of a swap


POSTGRES_NAME_BYTES = 63  # PostgreSQL cuts every identifier longer than this to this length


def truncated_name(tables: ShadowTables, backend: str) -> str | None:
    """The first name the builder would create on a PostgreSQL target that is longer than PostgreSQL
    keeps (a table, a declared index or constraint, or a ``__shadow`` copy of one), as a problem
    naming what the projection declared; ``None`` on SQLite, which keeps names whole."""
    if backend != "postgresql":
        return None
    for declared in tables.live.values():
        shadow = tables.shadow[declared.name]
        named = [("table", declared.name, declared.name, shadow.name)]
        named += [("index", str(i.name), str(i.name), f"{i.name}__shadow") for i in declared.indexes if i.name]
        named += [("constraint", c.name, c.name, f"{c.name}__shadow") for c in declared.constraints
                  if isinstance(c.name, str) and c.name]
        for kind, name, live, copy in named:
            longest = max(len(live.encode()), len(copy.encode()))
            if longest > POSTGRES_NAME_BYTES:
                where = "" if kind == "table" else f" of table {declared.name!r}"
                return (f"{kind} {name!r}{where} is too long for PostgreSQL: with the '__shadow' suffix of "
                        f"its rebuild copy it takes {longest} bytes, and PostgreSQL keeps {POSTGRES_NAME_BYTES} "
                        f"bytes (give it a name of at most {POSTGRES_NAME_BYTES - len('__shadow')} bytes)")
    return None


def nul_name(tables: Sequence[Table]) -> str | None:
    """The first name a projection declares (a table, a column, an index or a named constraint)
    that holds NUL, which neither SQLite nor PostgreSQL takes in an identifier, as a problem naming
    where it is (never the name itself: its characters may not print); ``None`` when there is none."""
    for i, table in enumerate(tables):
        if "\x00" in table.name:
            return f"table #{i} of the projection has a name holding NUL"
        where = f"of table #{i} of the projection"
        for j, column in enumerate(table.columns):
            if "\x00" in column.name:
                return f"column #{j} {where} has a name holding NUL"
        for kind, items in (("index", table.indexes), ("constraint", table.constraints)):
            for item in items:
                if isinstance(item.name, str) and "\x00" in item.name:
                    return f"{kind} {where} has a name holding NUL"
    return None


def reserved_table(name: str) -> bool:
    """Whether a projection table may not be called ``name``: fencepost keeps a table of that name."""
    return name.startswith(RESERVED_PREFIX) or name == SWAP_PARKING or name in metadata.tables


# The columns of 3001 only: a read-only status works on a target whose 3002 is not applied yet.
_CHECKPOINT_COLUMNS = [c for c in checkpoints.columns if c.name not in ("projection", "source_name")]
load_checkpoint = select(*_CHECKPOINT_COLUMNS).where(checkpoints.c.name == bindparam("name"))
share_of = select(checkpoints.c.projection, checkpoints.c.source_name).where(checkpoints.c.name == bindparam("name"))
any_share = select(checkpoints.c.name).where(checkpoints.c.projection == bindparam("projection")).limit(1)


def held_revisions(table: Table) -> Select:
    """``(run_id, source, revision)`` held by one projection for the run ids of the JSON array ``ids``.

    One parameter for the whole page: an expanding ``IN`` is re-rendered for every page length.
    """
    return select(table.c.run_id, table.c.source, table.c.revision).where(
        table.c.name == bindparam("name"), in_json_ids(table.c.run_id, "ids")
    )


held_live = held_revisions(run_revisions)
held_shadow = held_revisions(run_revisions_shadow)


def _held_lateral(table: Table) -> TextClause:
    # PostgreSQL: one unique-key probe per id, whatever the planner believes about the table. With
    # ``run_id = ANY(...)`` a table filled by this very build (no statistics yet) is read through the
    # ``name`` prefix of its key with the ids as a filter, every held row of the projection compared
    # with every id: each page slower than the last (2 -> 100+ ms per page of 500 over a 20,000-run
    # first build). ``LIMIT 1`` keeps the subquery a per-id lookup on the full primary key.
    return text(
        "SELECT i.id, h.source, h.revision FROM jsonb_array_elements_text(CAST(:ids AS JSONB)) AS i(id) "
        f"CROSS JOIN LATERAL (SELECT source, revision FROM {table.name} "
        "WHERE name = :name AND run_id = i.id LIMIT 1) AS h"
    )


_HELD: dict[tuple[str, bool], Executable] = {
    ("sqlite", False): held_live, ("sqlite", True): held_shadow,
    ("postgresql", False): _held_lateral(run_revisions), ("postgresql", True): _held_lateral(run_revisions_shadow),
}


def held_rows(conn: Connection, shadow: bool, name: str, ids: str) -> Sequence[Any]:
    """``(run_id, source, revision)`` held by projection ``name`` for the JSON array of run ids ``ids``."""
    stmt = _HELD.get((conn.dialect.name, shadow))
    if stmt is None:
        stmt = held_shadow if shadow else held_live
    return conn.execute(stmt, {"name": name, "ids": ids}).all()

last_rebuild = (
    select(rebuilds)
    .where(rebuilds.c.name == bindparam("name"))
    .order_by(rebuilds.c.rebuild_id.desc())
    .limit(1)
)


def _for_rows(stmt: Insert, dialect: Any) -> tuple[str, Any]:
    """``stmt`` compiled once, and how a row dict becomes its driver parameters."""
    compiled = stmt.compile(dialect=dialect)
    positions = tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
    if positions is None:
        return str(compiled), None
    # itemgetter raises KeyError for a row without one of the columns. Of one name it returns the
    # bare value, not a 1-tuple: wrap that case.
    return str(compiled), itemgetter(*positions) if len(positions) > 1 else (lambda row, n=positions[0]: (row[n],))


def _upsert(backend: Any, table: Table, conflict: tuple[str, ...]) -> Insert:
    stmt = backend.insert(table)
    return stmt.on_conflict_do_update(
        index_elements=list(conflict),
        set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name not in conflict},
    )


def upsert_many(conn: Connection, backend: Any, table: Table, conflict: tuple[str, ...],
                rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` into ``table``, replacing every other column of a row whose ``conflict`` key exists.

    Every row must carry every column of ``table`` (a missing one raises ``KeyError`` on both
    backends). The backend may send the page as one statement (``Backend.bulk_upsert``: one JSON
    text on PostgreSQL); otherwise, and for column types it cannot batch, the statement is compiled
    once per table and dialect and the rows go through the driver's ``executemany`` (SQLAlchemy's
    own executemany builds a parameter dict per row through the compiler, which costs more than
    the insert itself on SQLite).
    """
    if not rows:
        return
    if backend.bulk_upsert(conn, table, conflict, rows):
        return
    # Kept with the table: two tables of one name (other databases, other columns) differ.
    cache = statement_cache(table)
    key = ("upsert", conflict, conn.dialect.name)
    found = cache.get(key)
    if found is None:
        found = cache[key] = _for_rows(_upsert(backend, table, conflict), conn.dialect)
    sql, getter = found
    conn.exec_driver_sql(sql, rows if getter is None else list(map(getter, rows)))


def upsert_values(conn: Connection, backend: Any, table: Table, conflict: tuple[str, ...],
                  rows: list[tuple[Any, ...]]) -> None:
    """``upsert_many`` for rows given as tuples of every column of ``table``, in its column order.

    A page built as tuples skips a dict per row and the dict-to-parameters step: with a positional
    driver (SQLite) the tuples are sent as they are. A backend that sends a page as one statement
    (``Backend.bulk_upsert``) is given the rows as dicts. A tuple of another length than the table's
    columns raises ``ValueError`` before anything is sent.
    """
    if not rows:
        return
    names = [c.name for c in table.columns]
    for row in rows:
        if len(row) != len(names):
            raise ValueError(f"a row of {table.name} has {len(row)} values for {len(names)} columns")
    if type(backend).bulk_upsert is not Backend.bulk_upsert:
        if not backend.bulk_upsert_values(conn, table, conflict, rows):
            upsert_many(conn, backend, table, conflict, [dict(zip(names, row, strict=True)) for row in rows])
        return
    cache = statement_cache(table)
    key = ("upsert values", conflict, conn.dialect.name)
    found = cache.get(key)
    if found is None:
        compiled = _upsert(backend, table, conflict).compile(dialect=conn.dialect)
        positions = list(compiled.positiontup or ()) if compiled.positional else None
        # None: the tuples are the parameters as they are; else how a tuple becomes them.
        order: Any = None
        if positions is None:
            order = lambda row: dict(zip(names, row, strict=True))  # noqa: E731 - a named-parameter driver
        elif positions != names:
            pick = itemgetter(*(names.index(n) for n in positions))
            order = (lambda row: (pick(row),)) if len(positions) == 1 else pick
        found = cache[key] = (str(compiled), order)
    sql, order = found
    conn.exec_driver_sql(sql, rows if order is None else list(map(order, rows)))
