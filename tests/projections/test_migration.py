"""Migrations 3001 and 3002 create exactly the builder tables ``projections._sql`` declares, on both backends."""

from __future__ import annotations

from sqlalchemy import inspect

from fencepost._durable import Database
from fencepost._migrations import migrate
from fencepost.projections import _sql


def test_projection_migration_matches_the_declared_tables(db_url):
    db = Database(db_url)
    try:
        assert migrate(db, ("projections",)) == [3001, 3002]
        assert migrate(db, ("projections",)) == []  # idempotent

        def reflect(conn):
            insp = inspect(conn)
            return {
                t.name: ({c["name"] for c in insp.get_columns(t.name, schema=db.schema)},
                         insp.get_pk_constraint(t.name, schema=db.schema)["constrained_columns"])
                for t in _sql.metadata.sorted_tables
            }

        found = db.read(reflect)
        for table in _sql.metadata.sorted_tables:
            columns, pk = found[table.name]
            assert columns == {c.name for c in table.columns}, table.name
            assert sorted(pk) == sorted(c.name for c in table.primary_key.columns), table.name
    finally:
        db.dispose()
