"""Helpers for change-feed tests: runs are written with raw SQL, the triggers track them all."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection

import fencepost


def insert_run(conn: Connection, run_id: str, *, created: int = 0, status: str = "pending",
               state: str = '{"flowName": "flow"}', **columns: Any) -> None:
    """INSERT one ``flows_runs`` row with raw SQL (no commit)."""
    values = {"run_id": run_id, "status": status, "state_json": state, "created_at_ms": created, **columns}
    names = ", ".join(values)
    params = ", ".join(f":{k}" for k in values)
    conn.execute(text(f"INSERT INTO flows_runs ({names}) VALUES ({params})"), values)


def update_run(conn: Connection, run_id: str, **columns: Any) -> None:
    sets = ", ".join(f"{k} = :{k}" for k in columns)
    conn.execute(text(f"UPDATE flows_runs SET {sets} WHERE run_id = :run_id_"), {**columns, "run_id_": run_id})


def delete_run(conn: Connection, run_id: str) -> None:
    conn.execute(text("DELETE FROM flows_runs WHERE run_id = :r"), {"r": run_id})


def change_table(conn: Connection) -> list[tuple[str, int, bool]]:
    """The whole ``flows_run_changes`` table in revision order."""
    rows = conn.execute(text("SELECT run_id, revision, deleted FROM flows_run_changes ORDER BY revision"))
    return [(r[0], int(r[1]), r[2] == 1) for r in rows]


def page_all(feed: fencepost.ChangeFeed, position: fencepost.Position, limit: int = 500) -> list[fencepost.Change]:
    """Every change after ``position``, paging until ``has_more`` is false."""
    out: list[fencepost.Change] = []
    while True:
        batch = feed.changes_since(position, limit)
        out.extend(batch.changes)
        position = batch.next_position
        if not batch.has_more:
            return out


def restore_older_copy(store, raw, backend, tmp_path, write_more) -> None:
    """Take a backup, ``write_more()``, then put the backup back over the live database.

    SQLite: a real copy with the backup API, restored over the live file (same source id, lower
    revision). PostgreSQL: the same end state made with raw SQL (rows, change rows and revision
    rewound), since restoring a schema in the shared server is out of reach of a test.
    """
    if backend == "sqlite":
        import sqlite3

        backup = sqlite3.connect(str(tmp_path / "backup.db"))
        live = sqlite3.connect(str(store.db.path))
        live.backup(backup)
        write_more()
        backup.backup(live)  # the restore: the older copy, same source id, lower revision
        live.close()
        backup.close()
    else:
        write_more()
        raw.execute(text("DELETE FROM flows_runs WHERE run_id LIKE :p"), {"p": "later-%"})
        raw.execute(text("DELETE FROM flows_run_changes WHERE run_id LIKE :p"), {"p": "later-%"})
        raw.exec_driver_sql("UPDATE flows_run_source SET revision = 2")
        raw.commit()


@pytest.fixture
def origin(store: fencepost.Store) -> fencepost.Position:
    """Revision 0 of the store's current source."""
    return fencepost.Position(store.feed.position().source, 0)
