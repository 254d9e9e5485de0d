"""Journal migrations 0002/0003 upgrade a populated journal without losing or breaking an entry."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from fencepost._durable import Database
from fencepost._migrations import _LEDGER, STORE_NAMESPACES, discover, migrate
from fencepost._store import Store
from fencepost.clock import ManualClock
from fencepost.journal import NewEntry, verify


def _apply_all_but(db: Database, skip: set[int]) -> None:
    wanted = [m for m in discover(db.backend.migration_suffix, STORE_NAMESPACES) if m.id not in skip]

    def body(conn) -> None:
        if db.backend.name == "postgresql":
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{db.schema}"')
        conn.exec_driver_sql(_LEDGER[db.backend.name])
        for m in wanted:
            for statement in db.backend.split_script(m.script):
                conn.exec_driver_sql(statement)
            conn.execute(text("INSERT INTO flows_migrations (migration_id, name) VALUES (:i, :n)"),
                         {"i": m.id, "n": m.recorded_name})

    db.write(body)


def test_position_key_migration_keeps_every_entry_and_the_chain(db_url: str) -> None:
    db = Database(db_url)
    try:
        _apply_all_but(db, {2, 3})
        store = Store(db, clock=ManualClock(0))
        for i in range(6):
            store.journal.append_unfenced(f"run-{i % 2}", "t", {"i": i}, source_id="p")
        store.journal.append_many_unfenced("run-0", [NewEntry("t", {"b": b}) for b in range(3)], source_id="q")
        before = list(store.journal.log())
        assert migrate(db) == [2, 3]
        assert list(store.journal.log()) == before
        assert verify(store).ok
        # the upgraded table keeps its guarantees
        assert store.journal.append_unfenced("run-1", "t", {}, source_id="p").position == 10
        with pytest.raises(Exception):  # noqa: B017 - append-only trigger; driver error class differs
            db.write(lambda c: c.execute(text("UPDATE flows_journal_events SET payload_json = '{}'")))
        with pytest.raises(Exception):  # noqa: B017 - (run_id, seq) is still unique
            db.write(lambda c: c.execute(text(
                "INSERT INTO flows_journal_events SELECT run_id, seq, event_id || 'x', source_id, source_seq + 100,"
                " emitted_at_ms, event_type, payload_json, meta_json, content_hash, position + 100,"
                " stream_prev_hash, log_prev_hash, entry_hash FROM flows_journal_events WHERE position = 1")))
        assert verify(store).ok
    finally:
        db.dispose()
