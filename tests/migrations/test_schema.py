"""Migrations: one pass, idempotent, concurrent-safe, and equal to what ``_schema.py`` declares."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import inspect, text

import fencepost
from fencepost import _schema
from fencepost._durable import Database
from fencepost._migrations import STORE_NAMESPACES, discover, migrate
from tests.conftest import back_to_4001, drop_schema, ledger_of, race_processes, require_postgres


def _columns(db: Database, table: str) -> dict[str, bool]:
    with db.connect() as conn:
        insp = inspect(conn)
        return {c["name"]: bool(c["nullable"]) for c in insp.get_columns(table)}


def _pk(db: Database, table: str) -> list[str]:
    with db.connect() as conn:
        return list(inspect(conn).get_pk_constraint(table)["constrained_columns"])


def test_migrated_schema_matches_declared_tables(store: fencepost.Store) -> None:
    """Every table in ``_schema.metadata`` exists with exactly its columns, nullability and key."""
    for table in _schema.metadata.sorted_tables:
        reflected = _columns(store.db, table.name)
        declared = {c.name: bool(c.nullable) for c in table.columns}
        assert reflected == declared, table.name
        assert sorted(_pk(store.db, table.name)) == sorted(c.name for c in table.primary_key.columns), table.name


def test_every_migration_is_recorded_once_under_its_name(store: fencepost.Store, raw) -> None:
    rows = raw.exec_driver_sql("SELECT migration_id, name FROM flows_migrations ORDER BY migration_id").all()
    expected = [(m.id, m.recorded_name) for m in discover(store.db.backend.migration_suffix, STORE_NAMESPACES)]
    assert [(int(a), b) for a, b in rows] == expected


def test_migrate_again_applies_nothing(store: fencepost.Store) -> None:
    assert migrate(store.db) == []


def test_source_identity_is_32_lowercase_hex_at_revision_zero(store: fencepost.Store, raw) -> None:
    source, revision = raw.exec_driver_sql("SELECT source, revision FROM flows_run_source").one()
    assert len(source) == 32 and all(c in "0123456789abcdef" for c in source)
    assert int(revision) == 0


def test_migration_recorded_under_another_name_is_refused(store: fencepost.Store, raw) -> None:
    raw.exec_driver_sql("UPDATE flows_migrations SET name = 'journal_renamed' WHERE migration_id = 1")
    raw.commit()
    with pytest.raises(fencepost.OpenError) as err:
        migrate(store.db)
    assert err.value.code == "schema_mismatch"
    assert "recorded under another name" in str(err.value) and str(err.value).endswith("migration(s): 1")


def _open_and_count(url: str, barrier, out) -> None:
    barrier.wait()
    try:
        with fencepost.open(url) as s:
            with s.db.connect() as conn:
                n = conn.exec_driver_sql("SELECT count(*) FROM flows_migrations").scalar()
                src = conn.exec_driver_sql("SELECT count(*) FROM flows_run_source").scalar()
        out.put(("ok", int(n), int(src)))
    except BaseException as exc:  # report to the parent instead of dying silently
        out.put(("error", type(exc).__name__, str(exc)[:200]))


def test_four_processes_opening_one_fresh_database_migrate_it_once(db_url: str) -> None:
    """Opening a fresh file/schema from 4 processes at once applies each migration exactly once."""
    results, _ = race_processes(_open_and_count, lambda _: (db_url,), 4)
    assert all(r[0] == "ok" for r in results), results
    n_migrations = len(discover("sqlite" if db_url.startswith("sqlite") else "postgresql", STORE_NAMESPACES))
    assert {r[1] for r in results} == {n_migrations}
    assert {r[2] for r in results} == {1}


def test_opening_a_fresh_sqlite_file_another_connection_is_writing_waits_for_the_wal_switch(tmp_path) -> None:
    """Switching a file to WAL needs it to itself, and SQLite answers SQLITE_BUSY at once (no busy
    wait) while another connection holds its write lock: the open waits and retries instead of
    failing, as it does when several processes open one new file together (SQLite only: PostgreSQL
    has no journal mode)."""
    import sqlite3
    import threading
    import time

    path = tmp_path / "fresh.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE other_tool (x INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO other_tool VALUES (1)")
    # The stopwatch starts before the timer that frees the lock: a stall between the two lines
    # (a busy machine) must not eat into the wait this measures.
    started = time.monotonic()
    threading.Timer(0.5, lambda: holder.execute("COMMIT")).start()
    with fencepost.open(f"sqlite:///{path}") as store:
        waited = time.monotonic() - started
        store.runs.create("r", "{}")
        mode = store.db.read(lambda conn: conn.exec_driver_sql("PRAGMA journal_mode").scalar())
    holder.close()
    assert waited >= 0.4  # it did meet the lock (and waited it out)
    assert mode == "wal"


def test_readonly_open_of_missing_sqlite_file_is_an_error(tmp_path) -> None:
    with pytest.raises(fencepost.FencepostError):
        fencepost.open(f"sqlite:///{tmp_path / 'absent.db'}", readonly=True)
    assert not (tmp_path / "absent.db").exists()


def test_readonly_open_never_migrates_an_empty_postgres_schema() -> None:
    """A read-only open of an empty PostgreSQL schema fails and creates no table."""
    base = require_postgres()
    schema = "t_" + uuid.uuid4().hex[:16]
    db_url = f"{base}?schema={schema}"
    with pytest.raises(fencepost.FencepostError):
        fencepost.open(db_url, readonly=True)
    db = Database(db_url)
    try:
        with db.connect() as conn:
            n = conn.execute(
                text("SELECT count(*) FROM pg_tables WHERE schemaname = :s"), {"s": db.schema}
            ).scalar()
        assert n == 0
    finally:
        db.dispose()
        drop_schema(base, schema)


def test_an_interrupted_migration_pass_leaves_nothing_and_the_next_applies_it_all(db_url: str, monkeypatch) -> None:
    """EM-01 (analogue for our migrations): a store versions behind (4002, 4003 and 4004 pending) with
    a root run and a child run; the upgrade is interrupted in the middle of 4003. Nothing of the pass
    stays (4002's column is not there either: one transaction); the next pass applies 4002, 4003 and
    4004 and a further one nothing; the runs, their lineage and their revisions (all > 0) are intact."""
    with fencepost.open(db_url) as store:
        store.runs.create("root", "{}")
        store.runs.create("child", "{}", parent_run_id="root")
        before = store.feed.changes_since(fencepost.Position(store.feed.position().source, 0)).changes
    back_to_4001(db_url)
    db = Database(db_url)
    try:
        real = db.backend.split_script
        calls = []

        def split_then_interrupt(script: str):
            calls.append(script)
            statements = list(real(script))
            if len(calls) < 2:
                return statements

            def interrupted():
                yield statements[0]
                raise RuntimeError("interrupted mid-migration")

            return interrupted()

        monkeypatch.setattr(db.backend, "split_script", split_then_interrupt)
        with pytest.raises(Exception, match="interrupted"):
            migrate(db)
        monkeypatch.undo()
        assert {4002, 4003, 4004}.isdisjoint(ledger_of(db_url))
        assert "founded_at_ms" not in _columns(db, "flows_shard_membership")
        assert migrate(db) == [4002, 4003, 4004]
        assert migrate(db) == []
    finally:
        db.dispose()
    with fencepost.open(db_url) as store:
        assert store.runs.get("child").parent_run_id == "root"
        changes = store.feed.changes_since(fencepost.Position(store.feed.position().source, 0)).changes
        assert changes == before and all(c.revision > 0 for c in changes)


_TRIGGER_SCRIPT = """-- a comment; with a semicolon
CREATE TABLE x (n INTEGER); CREATE TABLE y (v TEXT);
CREATE TABLE z (n INTEGER);
INSERT INTO z (n) VALUES (1);
CREATE TRIGGER x_ins AFTER INSERT ON x BEGIN
  UPDATE y SET v = 'a;
b'; -- inline; comment
  INSERT INTO y (v) VALUES ('c;d');
  DELETE FROM z;
END;
"""


def test_sqlite_script_split_keeps_trigger_bodies_whole() -> None:
    """Pitfall "splitting SQL scripts on ``;``" (SQLite only: a PostgreSQL migration is sent whole in
    one execute). Trigger bodies, string literals and comments hold semicolons; two statements may
    share a line. Each split statement is exactly one complete statement, and applied in order they
    build a trigger whose whole body runs."""
    import sqlite3

    from fencepost._dialects import SqliteBackend

    statements = SqliteBackend.__new__(SqliteBackend).split_script(_TRIGGER_SCRIPT)
    trigger = _TRIGGER_SCRIPT[_TRIGGER_SCRIPT.index("CREATE TRIGGER"):].strip()
    assert statements == ["-- a comment; with a semicolon\nCREATE TABLE x (n INTEGER);", "CREATE TABLE y (v TEXT);",
                          "CREATE TABLE z (n INTEGER);", "INSERT INTO z (n) VALUES (1);", trigger]
    conn = sqlite3.connect(":memory:")
    for statement in statements:
        conn.execute(statement)  # one statement each: sqlite3 refuses two in one execute
    conn.execute("INSERT INTO x (n) VALUES (7)")
    assert conn.execute("SELECT v FROM y").fetchall() == [("c;d",)]
    assert conn.execute("SELECT count(*) FROM z").fetchone() == (0,)
