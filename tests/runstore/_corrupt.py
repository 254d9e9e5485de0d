"""Write corrupt rows on purpose: switch a table's CHECK constraints off for one connection."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection


def disable_check_constraints(conn: Connection, table: str) -> None:
    """SQLite: ``PRAGMA ignore_check_constraints``; PostgreSQL: drop the table's CHECKs (test schema only)."""
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
        return
    names = conn.execute(
        text("SELECT conname FROM pg_constraint WHERE conrelid = CAST(:t AS regclass) AND contype = 'c'"),
        {"t": table},
    ).scalars().all()
    for name in names:
        conn.exec_driver_sql(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
