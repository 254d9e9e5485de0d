"""A projection's live tables and their shadow copies: how a rebuild's shadow is emptied and swapped in.

A rebuild fills ``<table>__shadow`` beside each live table, page by page, and one transaction swaps it
in (REFERENCE 4 "Rebuild protocol"), so readers of the target see the old projection until that
commit and the new one after it, never a half-built one. A single source owns every row, so the
swap exchanges the tables' names. With several sources, a rebuild concerns one source's rows: its
shadow rows replace its live rows, and the rows of the other sources are not touched.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from sqlalchemy import (
    CheckConstraint,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    UniqueConstraint,
    bindparam,
    delete,
    quoted_name,
    select,
    text,
)
from sqlalchemy.engine import Connection

from fencepost._dialects import Backend
from fencepost.projections import _sql
from fencepost.projections._sources import SOURCE_COLUMN
from fencepost.projections.protocol import Projection, Target

if TYPE_CHECKING:
    from fencepost.projections._sources import Share

_PARKED = _sql.SWAP_PARKING


def _shadow_of(table: Table, metadata: MetaData) -> Table:
    shadow = table.to_metadata(metadata, name=f"{table.name}__shadow")
    # Index and constraint names are per schema (per database on SQLite): give the copies their own.
    for index in shadow.indexes:
        if index.name:
            index.name = quoted_name(f"{index.name}__shadow", None)
    for constraint in shadow.constraints:
        if isinstance(constraint.name, str) and constraint.name:
            constraint.name = f"{constraint.name}__shadow"
    return shadow


def _signature(index: Index) -> tuple[object, ...]:
    return (bool(index.unique), tuple(getattr(e, "name", None) or str(e) for e in index.expressions))


def _index_pairs(live: Table, shadow: Table) -> list[tuple[Index, Index]]:
    """Each declared index of ``live`` with its copy on ``shadow`` (same columns, same uniqueness)."""
    pairs = []
    left = sorted((i for i in shadow.indexes if i.name), key=lambda i: str(i.name))
    for index in sorted((i for i in live.indexes if i.name), key=lambda i: str(i.name)):
        match = next((s for s in left if s.name == f"{index.name}__shadow"), None) or next(
            (s for s in left if _signature(s) == _signature(index)), None)
        if match is not None:
            left.remove(match)
            pairs.append((index, match))
    return pairs


def _constraint_index_names(live: Table, shadow: Table) -> list[tuple[str, str]]:
    """(live, shadow) names of the indexes PostgreSQL keeps for the tables' primary key and named
    unique constraints: schema-wide names, like a declared index's."""
    pairs = []
    for mine, copy in ((live.primary_key, shadow.primary_key),):
        if isinstance(mine, PrimaryKeyConstraint) and mine.columns:
            pairs.append((str(mine.name) if isinstance(mine.name, str) and mine.name else f"{live.name}_pkey",
                          str(copy.name) if isinstance(copy.name, str) and copy.name else f"{shadow.name}_pkey"))
    shadow_uniques = {str(c.name): c for c in shadow.constraints if isinstance(c, UniqueConstraint)}
    for constraint in live.constraints:
        if isinstance(constraint, UniqueConstraint) and isinstance(constraint.name, str) and constraint.name:
            if f"{constraint.name}__shadow" in shadow_uniques:
                pairs.append((constraint.name, f"{constraint.name}__shadow"))
    return [(a, b) for a, b in pairs if len(a) <= 63 and len(b) <= 63]  # longer ones PostgreSQL truncates


def _check_names(live: Table, shadow: Table) -> list[tuple[str, str]]:
    """(live, shadow) names of the tables' named CHECK constraints (PostgreSQL renames them in
    place; a column's own CHECK is copied under its name, and names are per table there)."""
    copies = {str(c.name) for c in shadow.constraints if isinstance(c, CheckConstraint)}
    return [(c.name, f"{c.name}__shadow") for c in live.constraints
            if isinstance(c, CheckConstraint) and isinstance(c.name, str) and c.name
            and f"{c.name}__shadow" in copies and len(c.name) + len("__shadow") <= 63]


def _checks_of(conn: Connection, tables: list[str]) -> set[tuple[str, str]]:
    """``(table name, constraint name)`` of the CHECK constraints PostgreSQL keeps on ``tables``."""
    stmt = text("SELECT t.relname, c.conname FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid "
                "JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = current_schema() "
                "AND c.contype = 'c' AND t.relname IN :t").bindparams(bindparam("t", expanding=True))
    return {(str(table), str(name)) for table, name in conn.execute(stmt, {"t": tables})}


def _indexes_of(conn: Connection, tables: list[str]) -> dict[str, str]:
    """``{index name: table name}`` of the named indexes the target keeps on ``tables``."""
    if conn.dialect.name == "postgresql":
        sql = "SELECT indexname, tablename FROM pg_indexes WHERE schemaname = current_schema() AND tablename IN :t"
    else:  # SQLite's own indexes (of PRIMARY KEY and UNIQUE) have no SQL and cannot be named
        sql = "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL AND tbl_name IN :t"
    stmt = text(sql).bindparams(bindparam("t", expanding=True))
    return {str(name): str(table) for name, table in conn.execute(stmt, {"t": tables})}


class ShadowTables:
    """The declared (live) tables of ``projection`` and a shadow copy of each, by declared name."""

    def __init__(self, projection: Projection, tables: list[Table], *,
                 guard: Callable[[str], AbstractContextManager[None]] | None = None) -> None:
        self.projection = projection
        # Around each call of the projection's own ``reset``: the builder's, which names a statement
        # of that code the target refuses as the projection's.
        self._guard = guard or (lambda _what: nullcontext())
        shadow_md = MetaData()
        self.live = {t.name: t for t in tables}
        self.shadow = {t.name: _shadow_of(t, shadow_md) for t in tables}
        self._pairs = {name: _index_pairs(live, self.shadow[name]) for name, live in self.live.items()}

    def settle_index_names(self, conn: Connection) -> None:
        """Give every index of the live and shadow tables its declared name back, where the other
        table of the pair holds it (a swap exchanges the tables' names, not their indexes').

        Index names are schema-wide (database-wide on SQLite): a live table created again after a
        drop could not take its declared index names while the shadow table holds them, and the
        names would alternate from one rebuild to the next. PostgreSQL renames an index in place
        (its constraint with it). SQLite cannot rename an index: a misplaced one is dropped here and
        ``create_missing_indexes`` builds it again under its own name. Named CHECK constraints
        (PostgreSQL) are given back their names too (``_settle_check_names``).
        """
        names = [t.name for t in (*self.live.values(), *self.shadow.values())]
        found = _indexes_of(conn, names)
        postgres = conn.dialect.name == "postgresql"
        quote = conn.dialect.identifier_preparer.quote
        moves: list[tuple[str, str]] = []  # (current name, wanted name)
        for name, live in self.live.items():
            shadow = self.shadow[name]
            pairs = [(str(a.name), str(b.name)) for a, b in self._pairs[name]]
            if postgres:
                pairs += _constraint_index_names(live, shadow)
            for live_name, shadow_name in pairs:
                if found.get(live_name) == shadow.name:
                    moves.append((live_name, shadow_name))
                if found.get(shadow_name) == live.name:
                    moves.append((shadow_name, live_name))
        if not postgres:
            for current, _wanted in moves:
                conn.exec_driver_sql(f"DROP INDEX {quote(current)}")
            return
        self._settle_check_names(conn, names)
        # Through temporary names: the two indexes of a pair usually exchange theirs.
        parked = []
        for n, (current, wanted) in enumerate(moves):
            temp = f"{_sql.SWAP_PARKING}_ix{n}"
            conn.exec_driver_sql(f"ALTER INDEX {quote(current)} RENAME TO {quote(temp)}")
            parked.append((temp, wanted))
        for temp, wanted in parked:
            conn.exec_driver_sql(f"ALTER INDEX {quote(temp)} RENAME TO {quote(wanted)}")

    def _settle_check_names(self, conn: Connection, names: list[str]) -> None:
        """PostgreSQL: give each named CHECK constraint its declared name back where a swap left it
        under the other table's name. CHECK names are per table, so each is renamed in place."""
        pairs = [(live.name, self.shadow[name].name, pair)
                 for name, live in self.live.items() for pair in _check_names(live, self.shadow[name])]
        if not pairs:
            return  # no catalog query for a projection without named CHECK constraints
        found = _checks_of(conn, names)
        quote = conn.dialect.identifier_preparer.quote
        for live_table, shadow_table, (live_name, shadow_name) in pairs:
            for table, current, wanted in ((shadow_table, live_name, shadow_name),
                                           (live_table, shadow_name, live_name)):
                if (table, current) in found and (table, wanted) not in found:
                    conn.exec_driver_sql(f"ALTER TABLE {quote(table)} RENAME CONSTRAINT "
                                         f"{quote(current)} TO {quote(wanted)}")

    def create_missing_indexes(self, conn: Connection, *, live: bool = True, shadow: bool = True) -> None:
        """Create each declared index its table lacks (under its declared name)."""
        tables = [*(self.live.values() if live else ()), *(self.shadow.values() if shadow else ())]
        found = _indexes_of(conn, [t.name for t in tables])
        for table in tables:
            for index in table.indexes:
                if index.name and str(index.name) not in found:
                    index.create(conn)

    def all(self) -> list[Table]:
        """Every live and shadow table (created on the target if absent)."""
        return [*self.live.values(), *self.shadow.values()]

    def reset(self, conn: Connection, backend: Backend, share: Share) -> None:
        """Empty ``share``'s shadow rows and its shadow held revisions."""
        if share.label is None:
            with self._guard("reset"):
                self.projection.reset(Target(conn, backend, self.shadow, True))
        else:
            for shadow in self.shadow.values():
                conn.execute(delete(shadow).where(shadow.c[SOURCE_COLUMN] == share.label))
        rs = _sql.run_revisions_shadow
        conn.execute(delete(rs).where(rs.c.name == share.checkpoint))

    def reset_live(self, conn: Connection, backend: Backend, share: Share) -> None:
        """Empty ``share``'s live rows and its held revisions (the projection is built again)."""
        if share.label is None:
            with self._guard("reset"):
                self.projection.reset(Target(conn, backend, self.live, False))
        else:
            for live in self.live.values():
                conn.execute(delete(live).where(live.c[SOURCE_COLUMN] == share.label))
        rl = _sql.run_revisions
        conn.execute(delete(rl).where(rl.c.name == share.checkpoint))

    def swap(self, conn: Connection, backend: Backend, share: Share) -> None:
        """Make ``share``'s filled shadow live, with its held revisions.

        Rows move first, tables are renamed last: on PostgreSQL a rename locks every reader of the
        table out until the commit, so nothing that grows with the projection runs after it. The
        old rows a rename leaves in the shadow are emptied by ``empty_shadow``, after this commit
        (a builder that dies before it leaves them to the next rebuild, which empties the shadow
        at its start; nothing reads a shadow between rebuilds).
        """
        rl, rs = _sql.run_revisions, _sql.run_revisions_shadow
        conn.execute(delete(rl).where(rl.c.name == share.checkpoint))
        cols = [c.name for c in rl.columns]
        conn.execute(rl.insert().from_select(
            cols, select(*[rs.c[n] for n in cols]).where(rs.c.name == share.checkpoint)))
        if share.label is None:
            self._swap_tables(conn, backend, share)
            # SQLite: the live table's indexes dropped by ``settle_index_names`` are built again
            # under their own names (SQLite readers never wait for a writer); the shadow's once it
            # is empty (``empty_shadow``).
            self.create_missing_indexes(conn, shadow=False)
        else:
            self._swap_rows(conn, share.label)

    def empty_shadow(self, conn: Connection, backend: Backend, share: Share) -> None:
        """After a swap committed: empty ``share``'s shadow rows and held revisions, and give the
        shadow tables back the indexes a swap took from them."""
        self.reset(conn, backend, share)
        if share.label is None:
            self.create_missing_indexes(conn, live=False)

    def _swap_tables(self, conn: Connection, backend: Backend, share: Share) -> None:
        # The last shadow page's transaction, when this builder wrote it; else this one (all
        # shadow pages committed before it began), which is only more conservative.
        marker = share.shadow_marker if share.shadow_marker is not None else backend.write_marker(conn)
        if backend.renames_safe_after(conn, marker):
            # Exchange the tables' names (three renames, inside this transaction): the filled
            # shadow becomes the live table without copying a row, and the old live rows end
            # up in the shadow, emptied below. A renamed table keeps its indexes' names: they
            # are given back to the table they are declared for (``settle_index_names``) in
            # this transaction too, so they never depend on how many rebuilds came before.
            quote = conn.dialect.identifier_preparer.quote
            for name, live in self.live.items():
                shadow = self.shadow[name]
                for old, new in ((live.name, _PARKED), (shadow.name, live.name), (_PARKED, shadow.name)):
                    conn.exec_driver_sql(f"ALTER TABLE {quote(old)} RENAME TO {quote(new)}")
            self.settle_index_names(conn)
        else:
            # A reader holds a snapshot older than the shadow's last page (PostgreSQL): a
            # renamed table would show it a partial projection. Copy the rows instead, which
            # that reader cannot see until this commit, as it cannot see any of it.
            with self._guard("reset"):
                self.projection.reset(Target(conn, backend, self.live, False))
            for name, live in self.live.items():
                shadow = self.shadow[name]
                names = [c.name for c in live.columns]
                conn.execute(live.insert().from_select(names, select(*[shadow.c[n] for n in names])))

    def _swap_rows(self, conn: Connection, label: str) -> None:
        # The live tables hold every source's rows, so they cannot be renamed: this source's rows
        # are deleted and copied from the shadow inside the swap transaction, which readers see
        # whole or not at all (the other sources' rows are neither read nor written).
        for name, live in self.live.items():
            shadow = self.shadow[name]
            conn.execute(delete(live).where(live.c[SOURCE_COLUMN] == label))
            names = [c.name for c in live.columns]
            conn.execute(live.insert().from_select(
                names, select(*[shadow.c[n] for n in names]).where(shadow.c[SOURCE_COLUMN] == label)))
