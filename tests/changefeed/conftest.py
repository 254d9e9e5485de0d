"""Helpers for change-feed tests: runs are written with raw SQL, the triggers track them all."""

from __future__ import annotations

import time
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


class IdleFollower:
    """Whether this process's follower is caught up and idle: waiting, with nothing left that makes
    it page again on its own. What a test that counts the queries of an idle follower, or times
    how fast an idle follower stops, must wait for, not a sleep.

    The follower's hint source starts beside its first page, on a thread of its own, and may be
    ready long after that page on a busy machine. On PostgreSQL the listener's connect is a hint
    (notifications sent before it listened are lost) and costs one more page: idle means a wait
    entered with no hint pending after that hint. On SQLite the file watch's first event costs one
    ``PRAGMA data_version`` and no page: idle means in a wait, the first page done, and the watch
    registered (so a commit of another process is noticed). One follower at a time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from fencepost.changefeed import follow

        # The waiter in its wait: (it, hints it had taken at entry, a hint pending then).
        self._waiting: tuple[Any, int, bool] | None = None
        real_wait, real_note = follow._Waiter.wait, follow._Waiter.note_hint
        self._sqlite = follow._SqliteWaiter

        def note_hint(waiter: Any) -> None:
            real_note(waiter)
            # Counted after the hint is set: a count seen means its hint was set before.
            waiter.idle_test_hints = getattr(waiter, "idle_test_hints", 0) + 1

        def wait(waiter: Any, stop: Any, poll_interval: float) -> None:
            hints = getattr(waiter, "idle_test_hints", 0)
            self._waiting = (waiter, hints, waiter.hint.is_set())
            try:
                real_wait(waiter, stop, poll_interval)
            finally:
                self._waiting = None

        monkeypatch.setattr(follow._Waiter, "note_hint", note_hint)
        monkeypatch.setattr(follow._Waiter, "wait", wait)

    def now(self) -> bool:
        waiting = self._waiting
        if waiting is None:
            return False
        waiter, hints, pending = waiting
        if isinstance(waiter, self._sqlite):
            return getattr(waiter, "idle_test_hints", 0) >= 1
        return hints >= 1 and not pending

    def wait(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.now():
            assert time.monotonic() < deadline, f"the follower was not idle within {timeout} s"
            time.sleep(0.01)


@pytest.fixture
def idle_follower(monkeypatch: pytest.MonkeyPatch) -> IdleFollower:
    return IdleFollower(monkeypatch)
