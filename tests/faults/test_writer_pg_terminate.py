"""PostgreSQL: the writer's backend terminated (``pg_terminate_backend``) mid-transaction and mid-commit.

Mid-transaction the outcome is known (nothing committed), so the writer retries on a new
connection and the caller sees success, applied once. Mid-commit the outcome is unknown, so the
caller gets ``persistence_failed`` with the driver's code and nothing is retried; here the commit
never completed, so nothing of it landed. Either way the advisory write lock dies with the backend
and the same Store writes again.
"""

from __future__ import annotations

import threading
import time

import pytest

import fencepost
from tests.faults.conftest import (
    RECOVERY_BOUND_S,
    assert_nothing_of,
    assert_once,
    assert_value_free,
    composite,
    record,
)

pytestmark = pytest.mark.slow


def _backend_pid(store: fencepost.Store) -> int:
    """The server pid of this thread's kept write connection (the one its next write uses)."""
    return int(store.db.write(lambda c: c.exec_driver_sql("SELECT pg_backend_pid()").scalar()))


def _terminate(store: fencepost.Store, pid: int) -> None:
    conn = store.db.connect()
    try:
        assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})").scalar() is True
        conn.commit()
    finally:
        conn.close()


def _wait_state(store: fencepost.Store, pid: int, query: str, timeout: float = 20) -> None:
    conn = store.db.connect()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = conn.exec_driver_sql(
                f"SELECT state, query FROM pg_stat_activity WHERE pid = {int(pid)}").first()
            conn.rollback()
            if row is not None and row[0] == "active" and row[1].strip().upper() == query:
                return
            time.sleep(0.01)
        raise AssertionError(f"backend never reached {query}")
    finally:
        conn.close()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_backend_terminated_mid_transaction_holding_the_lock(db_url: str, peer) -> None:
    """The backend dies while the transaction holds the advisory lock: a peer writes at once, and
    the writer's retry applies the body once on a fresh connection."""
    store = fencepost.open(db_url)
    try:
        other = peer(db_url)
        pids: list[int] = []
        holding, resume = threading.Event(), threading.Event()
        attempts: list[int] = []
        errors: list[BaseException] = []

        def body(tx):
            attempts.append(1)
            store.runs.create("mid-txn", '{"step": 1}')
            tx.append_unfenced("mid-txn", "made", {"n": 1}, source_id="fault-suite")
            pids.append(int(tx.conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()))
            if len(attempts) == 1:
                holding.set()
                assert resume.wait(30)
            tx.conn.exec_driver_sql("SELECT 1")

        def write() -> None:
            try:
                store.journal.transact(body)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        t = threading.Thread(target=write)
        t.start()
        assert holding.wait(30)
        _terminate(store, pids[0])
        # The lock died with the backend: another process writes while our body is still asleep.
        killed = time.monotonic()
        assert other.write(timeout=5) < RECOVERY_BOUND_S
        record("pg_terminate_backend mid-transaction", "postgresql", "nothing (retried once)",
               time.monotonic() - killed)
        resume.set()
        t.join(timeout=60)
        assert not errors, errors
        assert len(attempts) == 2 and pids[0] != pids[1]  # the retry ran on a new connection
        assert_once(store, "mid-txn")
        store.runs.create("after", "{}")
        assert other.write(timeout=5) < RECOVERY_BOUND_S
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_backend_terminated_mid_commit(db_url: str, peer) -> None:
    """COMMIT is in flight (a deferred trigger makes it slow) when the backend is terminated."""
    store = fencepost.open(db_url)
    try:
        store.db.write(lambda c: c.exec_driver_sql(
            "CREATE FUNCTION fault_slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$"))
        store.db.write(lambda c: c.exec_driver_sql(
            "CREATE CONSTRAINT TRIGGER fault_slow AFTER INSERT ON flows_runs DEFERRABLE INITIALLY DEFERRED "
            "FOR EACH ROW WHEN (NEW.run_id LIKE 'slow%%') EXECUTE FUNCTION fault_slow_commit()"))
        other = peer(db_url)
        since = store.feed.position()
        pid = _backend_pid(store)
        killer = threading.Thread(target=lambda: (_wait_state(store, pid, "COMMIT"), _terminate(store, pid)))
        killer.start()
        with pytest.raises(fencepost.JournalError) as err:
            composite(store, "slow-1")
        killer.join(timeout=30)
        assert err.value.code == "sink_failed"
        assert err.value.cause_code == "persistence_failed"  # type: ignore[attr-defined]
        assert err.value.db_code == "57P01"  # type: ignore[attr-defined]
        assert_value_free(err.value)

        cleared = time.monotonic()
        assert other.write(timeout=5) < RECOVERY_BOUND_S
        composite(store, "after")
        record("pg_terminate_backend mid-COMMIT", "postgresql", "JournalError sink_failed 57P01",
               time.monotonic() - cleared)
        assert time.monotonic() - cleared < 5
        assert_once(store, "after")
        assert_nothing_of(store, "slow-1", since)
    finally:
        store.close()


def _terminate_and_wait(store, pid: int) -> None:
    """End backend ``pid`` from another connection and wait until it is gone."""
    with store.db.connect() as other:
        assert other.exec_driver_sql(f"SELECT pg_terminate_backend({pid})").scalar() is True
        other.commit()
        deadline = time.monotonic() + 20
        while other.exec_driver_sql(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}").scalar():
            other.rollback()
            assert time.monotonic() < deadline, "the terminated backend never went away"
            time.sleep(0.01)


@pytest.mark.parametrize("backend", ["postgresql"])
def test_target_backend_terminated_mid_projection_page(make_db_url) -> None:
    """Covers pg_terminate_backend x projection build (nothing else terminates a target session).
    The target's backend is terminated while a page's transaction has written rows but not
    committed: the page is applied once (retried on a new connection, or failed as transient with
    nothing of it landed, the same builder then going on), and the projection equals a fresh build."""
    from sqlalchemy import event, text

    from fencepost.projections import ProjectionBuilder, RunsByStatus

    source_url, target, fresh = make_db_url(), make_db_url(), make_db_url()
    store = fencepost.open(source_url)
    try:
        store.journal.transact(lambda tx: [store.runs.create(f"run-{i:03d}", "{}") for i in range(30)])
        with ProjectionBuilder(store, target, RunsByStatus(), batch_size=10) as builder:
            assert builder.status().applied_revision == 0  # the target reached once
            killed: list[int] = []

            def kill_mid_page(conn, cursor, statement, params, context, executemany) -> None:
                if not killed and "projection_runs_by_status" in statement and statement.lstrip().upper().startswith(
                        "INSERT"):
                    killed.append(int(cursor.connection.info.backend_pid))
                    _terminate_and_wait(store, killed[0])

            event.listen(builder.target.engine, "after_cursor_execute", kill_mid_page)
            try:
                try:
                    builder.catch_up()
                except fencepost.ProjectionError as exc:
                    assert exc.transient is True, exc  # type: ignore[attr-defined]
                    assert_value_free(exc)
                    assert builder.status().applied_revision % 10 == 0  # a page boundary
            finally:
                event.remove(builder.target.engine, "after_cursor_execute", kill_mid_page)
            assert killed, "the fault was never injected"
            builder.catch_up()
            status = builder.status()
            assert (status.lag, status.applied, status.rejected) == (0, 30, 0), status
        with ProjectionBuilder(store, fresh, RunsByStatus()) as other:
            other.catch_up()

        def rows(url):
            from fencepost._durable import Database

            db = Database(url, readonly=True)
            try:
                return db.read(lambda c: c.execute(text(
                    "SELECT run_id, status, source, revision FROM projection_runs_by_status ORDER BY run_id")).all())
            finally:
                db.dispose()

        assert rows(target) == rows(fresh) and len(rows(target)) == 30
    finally:
        store.close()
