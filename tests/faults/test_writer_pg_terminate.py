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
