"""A schema migration that meets another session's lock gives up in bounded time and lands nothing.

Defect: on PostgreSQL the migration pass (``fencepost init``, a writable ``fencepost.open`` of a store
with pending migrations, a projection builder preparing its target) waited without limit for the
table locks its ``ALTER TABLE`` needs. A console session left idle in transaction after reading a
fencepost table blocked it forever, and every later reader of that table queued behind its pending
ACCESS EXCLUSIVE request: the service stalled with no message. Now each try waits at most the
migration's lock timeout (PostgreSQL ``lock_timeout``, set for the migration's transaction only),
the pass tries a few times with a pause between tries (readers get through meanwhile), then fails
with ``OpenError`` ``migration_blocked``, naming the table and the blocking session's pid and state.

SQLite's migration takes the write lock (``BEGIN IMMEDIATE``), which its busy timeout already bounds
(``busy_timeout_ms``); a reader never blocks it (WAL). A writer holding the lock past that wait now
fails the migration with the same code. The faults are real: a second connection holding a lock,
a pending migration of a store built at an older ledger state.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

import fencepost
import fencepost._migrations as migrations
from fencepost._durable import Database
from fencepost._migrations import _LEDGER, STORE_NAMESPACES, discover, migrate
from tests.faults.conftest import assert_value_free

pytestmark = pytest.mark.slow

OLDER = 1005  # the store is built with every store migration up to this id; 1006 alters flows_runs
# Generous bound on a pass that gives up: 5 tries of SHORT seconds plus the pauses between them.
SHORT = 0.3
GIVES_UP_WITHIN_S = 10.0


def _older_store(url: str) -> list[int]:
    """Build the store at ``url`` as a version that shipped migrations up to ``OLDER`` left it;
    return the ids a migration pass now applies."""
    db = Database(url)
    every = discover(db.backend.migration_suffix, STORE_NAMESPACES)

    def body(conn: Any) -> None:
        db.backend.prepare_schema(conn)
        conn.exec_driver_sql(_LEDGER[db.backend.name])
        for m in every:
            if m.id <= OLDER:
                for statement in db.backend.split_script(m.script):
                    conn.exec_driver_sql(statement)
                conn.execute(text("INSERT INTO flows_migrations (migration_id, name) VALUES (:i, :n)"),
                             {"i": m.id, "n": m.recorded_name})

    try:
        db.write(body)
    finally:
        db.dispose()
    return [m.id for m in every if m.id > OLDER]


def _schema_of(db: Database) -> tuple[list[Any], list[Any]]:
    """The ledger and every table, column, index and trigger of the store (to prove nothing changed)."""
    def read(conn: Any) -> tuple[list[Any], list[Any]]:
        ledger = sorted(tuple(r) for r in conn.exec_driver_sql("SELECT migration_id, name FROM flows_migrations"))
        if db.backend.name == "sqlite":
            shape = sorted(tuple(r) for r in conn.exec_driver_sql("SELECT type, name, sql FROM sqlite_master"))
        else:
            shape = sorted(tuple(r) for r in conn.execute(text(
                "SELECT c.relname, c.relkind, a.attname, format_type(a.atttypid, a.atttypmod) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
                "WHERE n.nspname = :s"), {"s": db.schema}))
            shape += sorted(tuple(r) for r in conn.execute(text(
                "SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s"), {"s": db.schema}))
            shape += sorted(tuple(r) for r in conn.execute(text(
                "SELECT conname, pg_get_constraintdef(k.oid) FROM pg_constraint k "
                "JOIN pg_namespace n ON n.oid = k.connamespace WHERE n.nspname = :s"), {"s": db.schema}))
        return ledger, shape

    return db.read(read)


def _libpq(url: str) -> str:
    """The libpq form of a test PostgreSQL URL (fencepost's own ``schema`` option taken out)."""
    base = url.split("?", 1)[0]
    return base.replace("postgresql+psycopg://", "postgresql://", 1)


def _schema(url: str) -> str:
    return url.rsplit("schema=", 1)[1].split("&", 1)[0]


class Blocker:
    """A second session holding a lock a migration of the store at ``url`` needs, left idle in its
    transaction: on PostgreSQL a reader (``BEGIN; SELECT ... FROM flows_runs``, as a console or BI
    session leaves it), on SQLite a writer (``BEGIN IMMEDIATE``: SQLite readers never block one)."""

    def __init__(self, url: str, backend: str, *, sqlite_reader: bool = False, table: str = "flows_runs") -> None:
        self.backend = backend
        if backend == "sqlite":
            self.conn: Any = sqlite3.connect(url[len("sqlite:///"):].split("?", 1)[0], isolation_level=None, timeout=0)
            self.conn.execute("BEGIN" if sqlite_reader else "BEGIN IMMEDIATE")
            self.conn.execute(f"SELECT * FROM {table} LIMIT 1").fetchall()
            self.pid = None
        else:
            import psycopg

            self.conn = psycopg.connect(_libpq(url))
            self.conn.execute(f'SET search_path TO "{_schema(url)}"')
            self.conn.commit()
            self.conn.execute(f"SELECT * FROM {table} LIMIT 1").fetchall()  # opens the transaction
            self.pid = self.conn.info.backend_pid

    def release(self) -> None:
        if self.conn is not None:
            self.conn.rollback()
            self.conn.close()
            self.conn = None


@pytest.fixture
def blockers() -> Iterator[list[Blocker]]:
    made: list[Blocker] = []
    try:
        yield made
    finally:
        for b in made:
            b.release()


def _waiting_on(url: str, table: str, timeout: float = GIVES_UP_WITHIN_S) -> bool:
    """Whether some session is seen waiting for a lock on ``table`` of the store's schema within ``timeout``."""
    import psycopg

    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s AND NOT l.granted", (_schema(url), table)).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.01)
    return False


def _in_background(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc
        outcome["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _short(url: str, backend: str) -> str:
    """On SQLite, ``url`` with a short busy timeout (the wait SQLite's migration lock obeys)."""
    return (url + ("&" if "?" in url else "?") + "busy_timeout_ms=300") if backend == "sqlite" else url


def test_a_blocked_migration_gives_up_in_bounded_time_and_lands_nothing(
        db_url: str, backend: str, blockers: list[Blocker], monkeypatch: pytest.MonkeyPatch) -> None:
    """A pending migration meets a session holding a lock it needs: the pass fails within the bound
    with ``migration_blocked`` (transient, the driver's code, value-free), the ledger and the schema
    are exactly as before, and the SAME ``Database`` migrates once the session ends. On PostgreSQL
    the message names the table and the blocking session's pid and state, never its query."""
    monkeypatch.setattr(migrations, "MIGRATION_LOCK_TIMEOUT_S", SHORT, raising=False)  # fencepost's default, shortened
    pending = _older_store(db_url)
    db = Database(_short(db_url, backend))
    try:
        before = _schema_of(db)
        blocker = Blocker(db_url, backend)
        blockers.append(blocker)
        thread, outcome = _in_background(lambda: migrate(db))
        thread.join(GIVES_UP_WITHIN_S)
        assert not thread.is_alive(), "the migration still waits for the lock"
        err = outcome.get("error")
        assert isinstance(err, fencepost.OpenError), outcome
        assert err.code == "migration_blocked", str(err)
        assert err.transient is True and err.db_code == ("SQLITE_BUSY" if backend == "sqlite" else "55P03")
        assert_value_free(err)
        message = str(err)
        assert "end" in message and "again" in message, message  # says what to do
        if backend == "postgresql":
            assert outcome["elapsed"] >= SHORT, outcome  # it did wait for the lock
            assert "flows_runs" in message and f"pid {blocker.pid}" in message, message
            assert "idle in transaction" in message, message
            assert "SELECT" not in message and "LIMIT" not in message, message  # never the session's query
        else:
            assert "busy_timeout_ms" in message, message
        assert _schema_of(db) == before  # nothing of the pass landed: ledger and schema unchanged

        blocker.release()
        assert migrate(db) == pending  # the same Database, once the session ended
        assert [i for i, _ in _schema_of(db)[0]] == [m.id for m in discover(db.backend.migration_suffix,
                                                                             STORE_NAMESPACES)]
    finally:
        db.dispose()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_readers_are_not_stalled_while_the_migration_retries(
        db_url: str, blockers: list[Blocker], monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL only: there a waiting ALTER TABLE queues every later reader of its table behind
    its lock request (SQLite's migration waits for the write lock, which readers never take). A
    plain reader that arrives while the migration waits gets its rows within about one try's lock
    timeout (its ``statement_timeout`` makes a stall an error), and the pass still gives up."""
    per_try = 0.5
    monkeypatch.setattr(migrations, "MIGRATION_LOCK_TIMEOUT_S", per_try, raising=False)
    _older_store(db_url)
    db = Database(db_url)
    try:
        blockers.append(Blocker(db_url, "postgresql"))
        thread, outcome = _in_background(lambda: migrate(db))
        assert _waiting_on(db_url, "flows_runs"), "the migration never waited for flows_runs"
        import psycopg

        with psycopg.connect(_libpq(db_url), autocommit=True) as reader:
            reader.execute(f'SET search_path TO "{_schema(db_url)}"')
            reader.execute("SET statement_timeout = '3s'")
            for _ in range(3):  # readers arriving during several of the tries
                started = time.monotonic()
                assert reader.execute("SELECT count(*) FROM flows_runs").fetchone() == (0,)
                assert time.monotonic() - started < 3 * per_try + 0.5
                time.sleep(per_try / 2)
        thread.join(GIVES_UP_WITHIN_S + 5)
        assert not thread.is_alive(), "the migration still waits for the lock"
        assert getattr(outcome.get("error"), "code", None) == "migration_blocked", outcome
    finally:
        for b in blockers:
            b.release()
        db.dispose()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_sqlite_reader_idle_in_its_transaction_does_not_block_a_migration(
        db_url: str, blockers: list[Blocker]) -> None:
    """SQLite only: the PostgreSQL counterpart (a reader idle in transaction blocks the migration,
    which then gives up) is the test above. In WAL a reader keeps its snapshot and the migration,
    a writer, goes on at once; the reader still reads its snapshot."""
    pending = _older_store(db_url)
    db = Database(_short(db_url, "sqlite"))
    try:
        blocker = Blocker(db_url, "sqlite", sqlite_reader=True)
        blockers.append(blocker)
        assert migrate(db) == pending
        assert blocker.conn.execute("SELECT count(*) FROM flows_runs").fetchone() == (0,)
    finally:
        db.dispose()


def test_init_says_the_migration_was_blocked_and_a_rerun_succeeds(
        db_url: str, backend: str, blockers: list[Blocker], run_cli: Any) -> None:
    """``fencepost init`` on a store a session blocks: one ``Error: migration_blocked`` line, exit 1,
    nothing applied; the same command run again once the session ended migrates the store. The wait
    is the URL's own: PostgreSQL's ``lock_timeout`` given in ``options``, SQLite's ``busy_timeout_ms``."""
    pending = _older_store(db_url)
    knob = "busy_timeout_ms=300" if backend == "sqlite" else "options=-c%20lock_timeout%3D300"
    url = db_url + ("&" if "?" in db_url else "?") + knob
    blocker = Blocker(db_url, backend)
    blockers.append(blocker)
    started = time.monotonic()
    result = run_cli("--db", url, "init", timeout=60)
    assert time.monotonic() - started < GIVES_UP_WITHIN_S + 5, result
    assert result.code == 1, result
    lines = result.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: migration_blocked"), result
    if backend == "postgresql":
        assert "flows_runs" in lines[0] and f"pid {blocker.pid}" in lines[0], result
    assert result.out == "", result
    from tests.conftest import ledger_of

    assert max(ledger_of(db_url)) == OLDER

    blocker.release()
    again = run_cli("--db", url, "init", timeout=60)
    assert again.code == 0, again
    assert again.out.startswith("migrated") and ", ".join(str(i) for i in pending) in again.out, again


def test_a_projection_builder_whose_target_migration_is_blocked_says_so_and_goes_on_later(
        store: fencepost.Store, backend: str, make_db_url: Any, blockers: list[Blocker],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A projection target as a version before migration 3005 left it, and a session holding a lock
    3005 needs (PostgreSQL: a reader of ``projection_checkpoints`` idle in transaction; SQLite: a
    writer): the builder's first call fails with ``migration_blocked`` within the bound, the
    target's ledger keeps 3005 pending, and the SAME builder applies it once the session ended.
    As for every other target that cannot be used, that is a ``ProjectionError`` (``except
    ProjectionError`` catches it) naming the projection target, not ``fencepost.open``'s
    ``OpenError`` naming ``Store.open`` (the builder raised that before)."""
    from fencepost.projections import ProjectionBuilder, RunsByStatus
    from tests.conftest import ledger_of

    target = _short(make_db_url(), backend)
    shipped = migrations.discover
    with monkeypatch.context() as patch:
        patch.setattr(migrations, "discover", lambda *a, **k: [m for m in shipped(*a, **k) if m.id != 3005])
        with ProjectionBuilder(store, target, RunsByStatus()) as builder:
            builder.catch_up()
    assert {3004, 3005} & ledger_of(target) == {3004}
    monkeypatch.setattr(migrations, "MIGRATION_LOCK_TIMEOUT_S", SHORT, raising=False)
    store.runs.create("r1", "{}")
    blocker = Blocker(target, backend, table="projection_checkpoints")
    blockers.append(blocker)
    with ProjectionBuilder(store, target, RunsByStatus()) as builder:
        started = time.monotonic()
        with pytest.raises(fencepost.ProjectionError) as err:
            builder.catch_up()
        assert time.monotonic() - started < GIVES_UP_WITHIN_S
        assert err.value.code == "migration_blocked" and err.value.transient is True, str(err.value)
        assert getattr(err.value, "db_code", None) == ("SQLITE_BUSY" if backend == "sqlite" else "55P03")
        assert str(err.value).startswith("migration_blocked: Projection.prepare: projection target: "), \
            str(err.value)
        assert "Store.open" not in str(err.value) and "fencepost init" not in str(err.value), str(err.value)
        assert_value_free(err.value)
        if backend == "postgresql":
            assert "projection_checkpoints" in str(err.value) and f"pid {blocker.pid}" in str(err.value)
        assert 3005 not in ledger_of(target)
        blocker.release()
        builder.catch_up()  # the same builder, once the session ended
        assert 3005 in ledger_of(target)
        assert builder.status().applied >= 1
