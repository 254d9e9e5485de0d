"""Journal and change-feed errors say whether waiting may cure them, as run-store errors do.

Found by a walkthrough: a run-store error from the database carried ``transient`` (the worker and a
caller retry on it), but a journal write failing the same way (``sink_failed``), a journal read
(``read_failed``) and a run listing (``list_failed``) carried nothing, so a caller could not retry
uniformly. Outages are real: another connection holds the write lock past the store's wait
(SQLite's ``busy_timeout_ms``, PostgreSQL's ``lock_timeout``), or, for reads on PostgreSQL, an
``ACCESS EXCLUSIVE`` lock on the table read (a SQLite reader in WAL mode never waits for a lock).
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import fencepost
from fencepost import journal
from fencepost.errors import JournalError, RunStoreError
from tests.conftest import require_postgres
from tests.worker.test_outage_in_run import _short_wait, outage  # noqa: F401 - fixture


def test_a_journal_write_failing_on_a_held_write_lock_is_transient(outage) -> None:  # noqa: F811
    store, holder = outage
    store.runs.create("r1", "{}")
    holder.hold()
    with pytest.raises(JournalError) as info:
        store.journal.append_unfenced("r1", "app.step", {"n": 1}, source_id="test")
    assert info.value.code == "sink_failed"
    assert info.value.transient is True  # type: ignore[attr-defined]
    with pytest.raises(JournalError) as info:
        store.journal.transact(lambda tx: tx.append_unfenced("r1", "app.step", {"n": 2}, source_id="test"))
    assert info.value.code == "sink_failed" and info.value.transient is True  # type: ignore[attr-defined]
    holder.free()
    store.journal.append_unfenced("r1", "app.step", {"n": 1}, source_id="test")  # a retry succeeds


def test_a_journal_write_refused_for_good_is_not_transient(db_url: str) -> None:
    store = fencepost.open(db_url)
    store.runs.create("r1", "{}")

    def body(tx):
        tx.append_unfenced("r1", "app.step", {"n": 1}, source_id="test")
        tx.conn.exec_driver_sql("INSERT INTO flows_migrations (migration_id, name) VALUES (1, 'dup')")

    try:
        with pytest.raises(JournalError) as info:
            store.journal.transact(body)
        assert info.value.code == "sink_failed" and info.value.transient is False  # type: ignore[attr-defined]
    finally:
        store.close()


@pytest.fixture
def pg_table_locked(db_url: str, backend: str):
    """A PostgreSQL store waiting 100 ms for locks, and ``lock(table)``: another session holding an
    ACCESS EXCLUSIVE lock on it (every read of it then times out)."""
    require_postgres()
    store = fencepost.open(_short_wait(db_url, backend))
    schema = db_url.rsplit("schema=", 1)[1]
    engine = create_engine(db_url.rsplit("?", 1)[0], poolclass=NullPool)
    conns = []

    def lock(table: str) -> None:
        conn = engine.connect()
        conns.append(conn)
        conn.exec_driver_sql(f'LOCK TABLE "{schema}"."{table}" IN ACCESS EXCLUSIVE MODE')

    try:
        yield store, lock
    finally:
        for conn in conns:
            conn.rollback()
            conn.close()
        engine.dispose()
        store.close()


# PostgreSQL only: a SQLite reader in WAL mode never waits for a lock, so no read there can time out.
@pytest.mark.parametrize("backend", ["postgresql"])
def test_change_feed_and_journal_reads_timing_out_on_a_lock_are_transient(pg_table_locked) -> None:
    store, lock = pg_table_locked
    store.runs.create("r1", "{}")
    store.journal.append_unfenced("r1", "app.step", {}, source_id="test")
    start = store.feed.position()
    for table in ("flows_runs", "flows_run_changes", "flows_run_source", "flows_journal_events"):
        lock(table)
    calls = [
        (RunStoreError, lambda: store.feed.read(["r1"])),
        (RunStoreError, lambda: store.feed.changes_since(start)),
        (RunStoreError, lambda: store.feed.list_runs(None, None, 10)),
        (JournalError, lambda: store.journal.entries("r1")),
        (JournalError, lambda: list(store.journal.log())),
        (JournalError, lambda: journal.verify(store)),
        (JournalError, lambda: journal.head(store)),
        (JournalError, lambda: journal.replay_all(store)),
    ]
    for kind, call in calls:
        with pytest.raises(kind) as info:
            call()
        assert getattr(info.value, "transient", None) is True, info.value
