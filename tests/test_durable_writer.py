"""The durable writer: serialized writes, savepoints, whole-transaction retry, value-free failures."""

from __future__ import annotations

import sqlite3
import threading
import time

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

import fencepost
from fencepost._durable import DbFailure
from tests import _rmw_workers
from tests.conftest import race_processes, require_postgres

SETUP = "CREATE TABLE IF NOT EXISTS witness (n INTEGER NOT NULL)"


def _transient(backend: str) -> OperationalError:
    if backend == "sqlite":
        orig = sqlite3.OperationalError("database is locked")
        orig.sqlite_errorname = "SQLITE_BUSY"  # type: ignore[attr-defined]
        orig.sqlite_errorcode = 5  # type: ignore[attr-defined]
    else:
        orig = psycopg.errors.SerializationFailure("could not serialize")
    return OperationalError("INSERT ...", {}, orig)


@pytest.fixture
def witness(store: fencepost.Store):
    store.db.write(lambda c: c.exec_driver_sql(SETUP))
    return store


def _count(store: fencepost.Store) -> list[int]:
    return store.db.read(lambda c: [int(r[0]) for r in c.exec_driver_sql("SELECT n FROM witness ORDER BY n")])


def test_transient_failure_retries_the_whole_outer_callable(witness: fencepost.Store, backend: str) -> None:
    """DW-01: an injected busy/serialization failure inside a nested write reruns the outer body."""
    calls = []

    def nested(conn):
        if len(calls) == 1:
            raise _transient(backend)
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (100)")

    def outer(conn):
        calls.append(1)
        conn.execute(text("INSERT INTO witness (n) VALUES (:n)"), {"n": len(calls)})
        witness.db.write(nested)
        return len(calls)

    assert witness.db.write(outer) == 2
    assert _count(witness) == [2, 100]


# The refusal's message reads like a transient failure; its code does not (SQLite: a trigger's
# ABORT, SQLITE_CONSTRAINT_TRIGGER; PostgreSQL: a plpgsql RAISE, P0001).
_LOOKALIKE_REFUSAL = {
    "sqlite": ["CREATE TRIGGER witness_refuses BEFORE INSERT ON witness WHEN NEW.n = 13 "
               "BEGIN SELECT RAISE(ABORT, 'database is locked'); END"],
    "postgresql": ["CREATE FUNCTION witness_refuses() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                   "RAISE EXCEPTION 'deadlock detected; could not serialize access due to concurrent update'; END $$",
                   "CREATE TRIGGER witness_refuses BEFORE INSERT ON witness FOR EACH ROW WHEN (NEW.n = 13) "
                   "EXECUTE FUNCTION witness_refuses()"],
}


def test_a_refusal_worded_like_a_transient_error_is_not_retried(witness: fencepost.Store, backend: str) -> None:
    """Transient failures are told by their code, never by their text: a trigger refusing with the
    words of a busy database or a deadlock fails the write at once, its body run once, not retried."""
    for stmt in _LOOKALIKE_REFUSAL[backend]:
        witness.db.write(lambda c, stmt=stmt: c.exec_driver_sql(stmt))
    calls: list[int] = []

    def body(conn) -> None:
        calls.append(1)
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (13)")

    with pytest.raises(DbFailure) as err:
        witness.db.write(body)
    assert calls == [1]
    assert err.value.transient is False
    assert _count(witness) == []


def test_savepoint_rolls_back_only_the_nested_write(witness: fencepost.Store) -> None:
    def nested(conn):
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (7)")
        raise fencepost.RunStoreError("invalid_run", "test", "refused")

    def outer(conn):
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (1)")
        with pytest.raises(fencepost.RunStoreError):
            witness.db.write(nested)
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (2)")

    witness.db.write(outer)
    assert _count(witness) == [1, 2]


def test_error_in_body_rolls_back_everything(witness: fencepost.Store) -> None:
    def body(conn):
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (1)")
        raise fencepost.RunStoreError("invalid_run", "test", "refused")

    with pytest.raises(fencepost.RunStoreError):
        witness.db.write(body)
    assert _count(witness) == []


def test_after_commit_runs_once_after_outermost_commit_and_never_on_rollback(witness, backend) -> None:
    """DW-05/06 at the writer level: post-commit callbacks survive a retry exactly once."""
    fired: list[str] = []
    attempts = []

    def body(conn):
        attempts.append(1)
        witness.db.after_commit(lambda: fired.append("commit"))
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (1)")
        if len(attempts) == 1:
            raise _transient(backend)

    witness.db.write(body)
    assert fired == ["commit"] and len(attempts) == 2

    def failing(conn):
        witness.db.after_commit(lambda: fired.append("rolled-back"))
        raise fencepost.RunStoreError("invalid_run", "test", "refused")

    with pytest.raises(fencepost.RunStoreError):
        witness.db.write(failing)
    assert fired == ["commit"]


def test_constraint_failure_is_classified_without_values(store: fencepost.Store) -> None:
    secret = "sk-live-0123456789abcdef"

    def body(conn):
        conn.execute(
            text("INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES (:i, 'x', :s, 0)"),
            {"i": secret, "s": "{}"},
        )

    with pytest.raises(DbFailure) as err:
        store.db.write(body)
    assert err.value.category == "constraint"
    assert secret not in str(err.value) and err.value.__cause__ is None


@pytest.mark.parametrize("store", ["single"], indirect=True)
def test_reads_inside_a_write_are_under_the_writer_lock(store: fencepost.Store) -> None:
    """Read-modify-write from 4 threads never loses an increment and runs each body once (BEGIN
    IMMEDIATE / advisory lock taken before the body's first read).

    Group commit is off: with it, one leader runs the bodies of concurrent writers one after another
    in its own transaction, so the threads never race for the lock and the test could not fail.
    Counting body runs is what makes SQLite able to fail: there a read outside the lock meets a
    snapshot another thread has moved past, the write answers busy and the whole body runs again,
    so no increment is lost but a body runs twice (PostgreSQL at READ COMMITTED loses the
    increment). The processes test below checks the same across processes, with group commit on.
    """
    store.db.write(lambda c: c.exec_driver_sql("CREATE TABLE counter (n INTEGER NOT NULL)"))
    store.db.write(lambda c: c.exec_driver_sql("INSERT INTO counter (n) VALUES (0)"))
    rounds, threads = 40, 4
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []
    calls = [0] * threads

    def worker(i: int) -> None:
        def bump(conn):
            calls[i] += 1
            n = conn.exec_driver_sql("SELECT n FROM counter").scalar()
            conn.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})

        try:
            barrier.wait()
            for _ in range(rounds):
                store.db.write(bump)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert store.db.read(lambda c: c.exec_driver_sql("SELECT n FROM counter").scalar()) == rounds * threads
    assert calls == [rounds] * threads, "a body ran again: its read was not under the writer lock"


# --------------------------------------------------------------------------- failures leave no transaction
# Any failure at any point of a transaction (BEGIN, a statement, COMMIT, ROLLBACK) leaves the
# thread's connection rolled back or discarded: the write lock is free at once and the next call
# works. The real faults (full disk, deferred constraints at COMMIT, terminated backends) are in
# tests/faults/; these inject a failure where no real fault can be provoked on demand.


def _lock_is_free(store: fencepost.Store) -> bool:
    """Another connection takes the write lock without waiting."""
    if store.db.backend.name == "sqlite":
        conn = sqlite3.connect(store.db.path, timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()
    conn = store.db.connect()
    try:
        return bool(conn.exec_driver_sql(
            "SELECT pg_try_advisory_xact_lock(hashtextextended(current_schema(), 2099))").scalar())
    finally:
        conn.rollback()
        conn.close()


def test_a_write_is_one_transaction_under_the_lock_from_its_first_statement(store: fencepost.Store) -> None:
    """Inside a write body the writer lock is held and nothing written is visible to another
    connection until COMMIT; a body that raises leaves nothing. (PostgreSQL write connections
    run with the driver's autocommit off-switch and send BEGIN themselves, with the lock.)"""
    store.db.write(lambda c: c.exec_driver_sql("CREATE TABLE seen (n INTEGER NOT NULL)"))
    looked: dict[str, object] = {}

    def visible_elsewhere() -> int:
        if store.db.backend.name == "sqlite":
            other = sqlite3.connect(store.db.path, isolation_level=None)
            try:
                return other.execute("SELECT count(*) FROM seen").fetchone()[0]
            finally:
                other.close()
        with store.db.connect() as other:
            return other.exec_driver_sql("SELECT count(*) FROM seen").scalar()

    def body(conn) -> None:
        conn.exec_driver_sql("INSERT INTO seen (n) VALUES (1)")
        looked["lock_free"] = _lock_is_free(store)
        looked["visible"] = visible_elsewhere()
        if store.db.backend.name == "postgresql":
            looked["status"] = conn.connection.driver_connection.info.transaction_status.name

    store.db.write(body)
    assert looked["lock_free"] is False
    assert looked["visible"] == 0
    assert looked.get("status", "INTRANS") == "INTRANS"
    assert visible_elsewhere() == 1

    def fails(conn) -> None:
        conn.exec_driver_sql("INSERT INTO seen (n) VALUES (2)")
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError):
        store.db.write(fails)
    assert visible_elsewhere() == 1
    assert _lock_is_free(store)


def test_a_write_whose_first_statement_is_a_read_already_holds_the_writer_lock(store: fencepost.Store) -> None:
    """The lock is taken when the write begins, not at its first INSERT/UPDATE/DELETE: a read that
    opens a write body is already under it (SQLite: our own BEGIN IMMEDIATE, with the driver's
    implicit transactions turned off; PostgreSQL: the advisory lock sent with BEGIN)."""
    store.db.write(lambda c: c.exec_driver_sql("CREATE TABLE seen (n INTEGER NOT NULL)"))
    looked: dict[str, object] = {}

    def body(conn) -> None:
        looked["count"] = conn.exec_driver_sql("SELECT count(*) FROM seen").scalar()
        looked["lock_free"] = _lock_is_free(store)

    store.db.write(body)
    assert looked == {"count": 0, "lock_free": False}
    assert _lock_is_free(store)


def test_processes_racing_read_modify_writes_run_each_body_once(store: fencepost.Store, db_url: str) -> None:
    """4 processes x 25 read-then-write bodies, released together: no increment is lost and each
    body runs exactly once. A read under the lock never goes stale, so nothing needs a retry; a
    write that took the lock only at its first UPDATE would meet a snapshot another process had
    moved past (SQLite answers busy, and the whole body runs again)."""
    store.db.write(lambda c: c.exec_driver_sql("CREATE TABLE counter (n INTEGER NOT NULL)"))
    store.db.write(lambda c: c.exec_driver_sql("INSERT INTO counter (n) VALUES (0)"))
    rounds, workers = 25, 4
    calls, exit_codes = race_processes(_rmw_workers.bump_worker, lambda _: (db_url, rounds), workers)
    assert exit_codes == [0] * workers
    assert store.db.read(lambda c: c.exec_driver_sql("SELECT n FROM counter").scalar()) == rounds * workers
    assert calls == [rounds] * workers


def _hard_error(backend: str) -> OperationalError:
    """A non-transient driver error (an I/O error; PostgreSQL: an internal error)."""
    if backend == "sqlite":
        orig = sqlite3.OperationalError("disk I/O error")
        orig.sqlite_errorname = "SQLITE_IOERR"  # type: ignore[attr-defined]
        orig.sqlite_errorcode = 10  # type: ignore[attr-defined]
    else:
        orig = psycopg.errors.InternalError_("injected")
    return OperationalError("COMMIT", {}, orig)


def test_deferred_violation_at_commit_frees_the_lock_and_the_thread_writes_again(witness, backend) -> None:
    witness.db.write(lambda c: c.exec_driver_sql("CREATE TABLE parent (id INTEGER PRIMARY KEY)"))
    witness.db.write(lambda c: c.exec_driver_sql(
        "CREATE TABLE child (pid INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"))

    def violate(conn):
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (1)")
        conn.exec_driver_sql("INSERT INTO child (pid) VALUES (5)")

    for _ in range(3):
        with pytest.raises(DbFailure) as err:
            witness.db.write(violate)
        assert err.value.category == "constraint" and err.value.code is not None
        assert _lock_is_free(witness)
    witness.db.write(lambda c: c.exec_driver_sql("INSERT INTO witness (n) VALUES (2)"))
    assert _count(witness) == [2]


def test_failure_after_begin_leaves_no_transaction_open(witness, backend) -> None:
    """The write lock is taken (BEGIN IMMEDIATE / advisory lock) and then the begin step fails."""
    from sqlalchemy import event

    fail = [True]

    def after_begin(conn):
        if fail[0] and conn.get_execution_options().get("fencepost_write"):
            fail[0] = False
            if backend == "postgresql":
                witness.db.backend.begin_write(conn)  # the lock is held when the failure comes
            else:
                conn.connection.driver_connection.execute("BEGIN IMMEDIATE")  # likewise
            raise _hard_error(backend)

    event.listen(witness.db.engine, "begin", after_begin)
    try:
        with pytest.raises(DbFailure):
            witness.db.write(lambda c: c.exec_driver_sql("INSERT INTO witness (n) VALUES (1)"))
        assert _lock_is_free(witness)
        witness.db.write(lambda c: c.exec_driver_sql("INSERT INTO witness (n) VALUES (2)"))
    finally:
        event.remove(witness.db.engine, "begin", after_begin)
    assert _count(witness) == [2]


def test_failed_rollback_discards_the_connection(witness, backend) -> None:
    """The body fails and so does its ROLLBACK: the connection is closed (which ends the
    transaction), the body's error reaches the caller, and the next write gets a new connection."""
    from sqlalchemy import event

    fail = [True]

    def on_rollback(conn):
        if fail[0]:
            fail[0] = False
            raise _hard_error(backend)

    def body(conn):
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (1)")
        raise fencepost.RunStoreError("invalid_run", "test", "refused")

    event.listen(witness.db.engine, "rollback", on_rollback)
    try:
        with pytest.raises(fencepost.RunStoreError):
            witness.db.write(body)
        assert not fail[0]
        assert _lock_is_free(witness)
        witness.db.write(lambda c: c.exec_driver_sql("INSERT INTO witness (n) VALUES (2)"))
    finally:
        event.remove(witness.db.engine, "rollback", on_rollback)
    assert _count(witness) == [2]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_real_deadlock_with_another_session_reruns_the_whole_write(store: fencepost.Store, db_url: str) -> None:
    """PostgreSQL only: SQLite has one writer at a time (``BEGIN IMMEDIATE``) and no row locks, so
    two writers never deadlock there.

    Pitfall "transient errors": no injected error here. Our write locks row 1; another session
    holding row 2 waits for row 1; our write then waits for row 2. The server breaks the deadlock
    by failing our transaction with 40P01 (our ``deadlock_timeout`` is the shorter one): the writer
    classifies it by code, rolls back and re-runs the whole body, which then commits. Both
    sessions' increments are kept."""
    store.db.write(lambda c: c.exec_driver_sql(
        "CREATE TABLE locked (k INTEGER PRIMARY KEY, v INTEGER NOT NULL); INSERT INTO locked VALUES (1, 0), (2, 0)"))
    schema = db_url.rsplit("schema=", 1)[1]
    conninfo = require_postgres().replace("postgresql+psycopg://", "postgresql://")
    other = psycopg.connect(conninfo)
    other.execute(f"SET search_path TO {schema}")
    other.execute("SET deadlock_timeout = '10s'")
    other.execute("UPDATE locked SET v = v + 1 WHERE k = 2")  # holds row 2 until it commits
    other_pid = other.info.backend_pid
    other_done = threading.Event()
    failures: list[BaseException] = []

    def other_takes_row_1() -> None:
        try:
            other.execute("UPDATE locked SET v = v + 1 WHERE k = 1")  # waits for our row 1
            other.commit()
        except BaseException as exc:  # reported below
            failures.append(exc)
        finally:
            other_done.set()

    calls: list[int] = []
    waiter = threading.Thread(target=other_takes_row_1)

    def body(conn) -> None:
        calls.append(1)
        if len(calls) > 1:
            # The re-run waits for the other session to commit: were it to take row 1 again before the
            # other session's waiting UPDATE wakes, the two would deadlock a second time (a third run).
            assert other_done.wait(30)
        conn.exec_driver_sql("SET LOCAL deadlock_timeout = '100ms'")
        conn.exec_driver_sql("UPDATE locked SET v = v + 1 WHERE k = 1")
        if len(calls) == 1:
            waiter.start()
            for _ in range(500):  # until the other session waits on our row lock
                with psycopg.connect(conninfo) as probe:
                    waiting = probe.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                            (other_pid,)).fetchone()
                if waiting and waiting[0] == "Lock":
                    break
                time.sleep(0.01)
            else:
                raise AssertionError("the other session never waited for row 1")
        conn.exec_driver_sql("UPDATE locked SET v = v + 1 WHERE k = 2")  # first time: a deadlock

    try:
        store.db.write(body)
        assert other_done.wait(30)
    finally:
        waiter.join(30)
        other.close()
    assert failures == []
    assert calls == [1, 1]
    assert store.db.read(lambda c: c.exec_driver_sql("SELECT k, v FROM locked ORDER BY k").all()) == [(1, 2), (2, 2)]
