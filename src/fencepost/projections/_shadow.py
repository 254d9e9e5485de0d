"""A projection's live tables and their shadow copies: how a rebuild's shadow is emptied and swapped in.

A rebuild fills ``<table>__shadow`` beside each live table, page by page, and one transaction swaps it
in (REFERENCE 4 "Rebuild protocol"), so readers of the target see the old projection until that
commit and the new one after it, never a half-built one. A single source owns every row, so the
swap exchanges the tables' names. With several sources, a rebuild concerns one source's rows: its
shadow rows replace its live rows, and the rows of the other sources are not touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import MetaData, Table, delete, select
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
            index.name = f"{index.name}__shadow"
    for constraint in shadow.constraints:
        if isinstance(constraint.name, str) and constraint.name:
            constraint.name = f"{constraint.name}__shadow"
    return shadow


class ShadowTables:
    """The declared (live) tables of ``projection`` and a shadow copy of each, by declared name."""

    def __init__(self, projection: Projection, tables: list[Table]) -> None:
        self.projection = projection
        shadow_md = MetaData()
        self.live = {t.name: t for t in tables}
        self.shadow = {t.name: _shadow_of(t, shadow_md) for t in tables}

    def all(self) -> list[Table]:
        """Every live and shadow table (created on the target if absent)."""
        return [*self.live.values(), *self.shadow.values()]

    def reset(self, conn: Connection, backend: Backend, share: Share) -> None:
        """Empty ``share``'s shadow rows and its shadow held revisions."""
        if share.label is None:
            self.projection.reset(Target(conn, backend, self.shadow, True))
        else:
            for shadow in self.shadow.values():
                conn.execute(delete(shadow).where(shadow.c[SOURCE_COLUMN] == share.label))
        rs = _sql.run_revisions_shadow
        conn.execute(delete(rs).where(rs.c.name == share.checkpoint))

    def reset_live(self, conn: Connection, backend: Backend, share: Share) -> None:
        """Empty ``share``'s live rows and its held revisions (the projection is built again)."""
        if share.label is None:
            self.projection.reset(Target(conn, backend, self.live, False))
        else:
            for live in self.live.values():
                conn.execute(delete(live).where(live.c[SOURCE_COLUMN] == share.label))
        rl = _sql.run_revisions
        conn.execute(delete(rl).where(rl.c.name == share.checkpoint))

    def swap(self, conn: Connection, backend: Backend, share: Share) -> None:
        """Make ``share``'s filled shadow live, with its held revisions, and empty the shadow again."""
        if share.label is None:
            self._swap_tables(conn, backend, share)
        else:
            self._swap_rows(conn, share.label)
        rl, rs = _sql.run_revisions, _sql.run_revisions_shadow
        conn.execute(delete(rl).where(rl.c.name == share.checkpoint))
        cols = [c.name for c in rl.columns]
        conn.execute(rl.insert().from_select(
            cols, select(*[rs.c[n] for n in cols]).where(rs.c.name == share.checkpoint)))
        self.reset(conn, backend, share)

    def _swap_tables(self, conn: Connection, backend: Backend, share: Share) -> None:
        # The last shadow page's transaction, when this builder wrote it; else this one (all
        # shadow pages committed before it began), which is only more conservative.
        marker = share.shadow_marker if share.shadow_marker is not None else backend.write_marker(conn)
        if backend.renames_safe_after(conn, marker):
            # Exchange the tables' names (three renames, inside this transaction): the filled
            # shadow becomes the live table without copying a row, and the old live rows end
            # up in the shadow, emptied below. Indexes keep their own names, so index names
            # alternate between the two tables from one rebuild to the next.
            quote = conn.dialect.identifier_preparer.quote
            for name, live in self.live.items():
                shadow = self.shadow[name]
                for old, new in ((live.name, _PARKED), (shadow.name, live.name), (_PARKED, shadow.name)):
                    conn.exec_driver_sql(f"ALTER TABLE {quote(old)} RENAME TO {quote(new)}")
        else:
            # A reader holds a snapshot older than the shadow's last page (PostgreSQL): a
            # renamed table would show it a partial projection. Copy the rows instead, which
            # that reader cannot see until this commit, as it cannot see any of it.
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
