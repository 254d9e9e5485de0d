"""Named CHECK constraints of a projection's table keep their names across rebuilds.

Defect (found by a review, PostgreSQL): a rebuild exchanges the live and shadow tables' names; the
builder gave the primary key's and named unique constraints' names back to the table they are
declared for, but not a named CHECK constraint's: after one rebuild the live table carried
``cx_rev_ck__shadow`` and the shadow ``cx_rev_ck``, alternating at every rebuild, so a user's
``ALTER TABLE cx DROP CONSTRAINT cx_rev_ck`` failed (or dropped the shadow's). Now the live table
carries its declared CHECK names after every rebuild.

PostgreSQL only: SQLite has no ALTER TABLE ... RENAME CONSTRAINT and no statement that addresses a
CHECK constraint by name (its names only appear in error messages).
"""

from __future__ import annotations

import pytest
from sqlalchemy import BigInteger, CheckConstraint, Column, MetaData, Table, Text, UniqueConstraint, delete, text

import fencepost
from fencepost.projections import ProjectionBuilder

_table = Table("cx", MetaData(), Column("run_id", Text, primary_key=True), Column("k", Text),
               Column("revision", BigInteger, CheckConstraint("revision >= 0", name="cx_col_ck")),
               UniqueConstraint("k", name="cx_k_uq"), CheckConstraint("revision < 1000000", name="cx_rev_ck"))


class Checked:
    name = "cx"
    feed = "runs"
    tables = (_table,)

    def reset(self, target) -> None:
        target.conn.execute(delete(target.table("cx")))

    def apply(self, target, update) -> None:
        t = target.table("cx")
        values = {"k": "k-" + update.run_id, "revision": update.revision}
        target.conn.execute(target.insert(t).values(run_id=update.run_id, **values)
                            .on_conflict_do_update(index_elements=[t.c.run_id], set_=values))


def _names(builder) -> set[tuple[str, str]]:
    sql = text("SELECT t.relname, c.conname FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid "
               "WHERE t.relnamespace = current_schema()::regnamespace AND t.relname IN ('cx', 'cx__shadow')")
    return set(builder.target.read(lambda conn: conn.execute(sql).all()))


@pytest.mark.parametrize("backend", ["postgresql"])
def test_named_check_constraints_stay_on_the_table_they_are_declared_for_after_rebuilds(db_url, make_db_url):
    expected = {("cx", "cx_pkey"), ("cx", "cx_k_uq"), ("cx", "cx_col_ck"), ("cx", "cx_rev_ck"),
                ("cx__shadow", "cx__shadow_pkey"), ("cx__shadow", "cx_k_uq__shadow"),
                # A column's own CHECK is copied with its name (names are per table on PostgreSQL).
                ("cx__shadow", "cx_col_ck"), ("cx__shadow", "cx_rev_ck__shadow")}
    with fencepost.open(db_url) as store, ProjectionBuilder(store, make_db_url(), Checked()) as builder:
        store.runs.create("r0", "{}")
        builder.catch_up()
        assert _names(builder) == expected
        for i in range(3):
            store.runs.create(f"n{i}", "{}")
            builder.rebuild()
            assert _names(builder) == expected, f"after rebuild {i + 1}"
        with builder.target.connect() as conn:
            conn.execute(text("ALTER TABLE cx DROP CONSTRAINT cx_rev_ck"))
            conn.commit()
