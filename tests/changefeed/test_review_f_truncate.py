"""Defect (found by a review, PostgreSQL): a raw ``TRUNCATE flows_runs`` was accepted. TRUNCATE
fires none of the INSERT/UPDATE/DELETE triggers, so it wrote no tombstone and no revision; the
change table kept live rows for runs that no longer existed, and every reader of snapshots
(``read``, ``changes_with_snapshots``, ``follow_batches``, ``feed tail --follow``, projection
builders) failed with ``decode_failed`` for good.

Now migration 1008 refuses a TRUNCATE of ``flows_runs`` (and of ``flows_run_changes``) with a
message saying to delete runs with DELETE, and 0004 makes the journal refuse TRUNCATE as it refuses
UPDATE and DELETE; nothing changes and the feed stays readable. SQLite has no TRUNCATE (its DELETE
without WHERE fires the row triggers): there both migrations are no-ops, applied all the same so
the two ledgers stay in step.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

import fencepost
from fencepost import _migrations
from tests.conftest import ledger_of

NEW = (4, 1008)


def _cli(*args: str) -> tuple[int, str, str]:
    from fencepost.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _raw(url: str, sql: str) -> None:
    """Run ``sql`` on its own connection, as another client would (no fencepost in the way)."""
    schema = url.rsplit("schema=", 1)[1]
    engine = create_engine(url.split("?", 1)[0], poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'SET search_path = "{schema}"')
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


@pytest.mark.parametrize("table", ["flows_runs CASCADE", "flows_runs, flows_attempts", "flows_run_changes"])
def test_a_truncate_of_the_runs_is_refused_and_changes_nothing(pg_url, table):
    store = fencepost.open(pg_url)
    try:
        start = store.feed.position()
        for i in range(3):
            store.runs.create(f"t{i}", "{}")
        before = store.feed.changes_since(start)
        with pytest.raises(DBAPIError) as err:
            _raw(pg_url, f"TRUNCATE {table}")
        message = str(err.value.orig)
        assert "TRUNCATE of flows_run" in message and "is refused" in message, message
        assert "DELETE FROM flows_runs" in str(err.value.orig.diag.message_hint), err.value.orig.diag.message_hint
        assert store.feed.changes_since(start) == before
        snapshots = store.feed.read(["t0", "t1", "t2"]).snapshots
        assert [(type(s).__name__, s.run_id) for s in snapshots] == [("Observed", f"t{i}") for i in range(3)]
        assert [c.run_id for c in store.feed.changes_with_snapshots(start).changes] == ["t0", "t1", "t2"]
        # DELETE still works, and writes the tombstones.
        _raw(pg_url, "DELETE FROM flows_runs")
        after = store.feed.changes_since(before.next_position)
        assert sorted((c.run_id, c.deleted) for c in after.changes) == [("t0", True), ("t1", True), ("t2", True)]
        gone = store.feed.read(["t0"]).snapshots[0]
        assert isinstance(gone, fencepost.Missing) and gone.deleted, gone
    finally:
        store.close()


def test_a_truncate_of_the_journal_is_refused(pg_url):
    store = fencepost.open(pg_url)
    try:
        store.runs.create("j", "{}")
        run = store.runs.get("j")
        assert run is not None
        count = store.db.read(lambda conn: conn.exec_driver_sql("SELECT count(*) FROM flows_journal_events").scalar())
        with pytest.raises(DBAPIError) as err:
            _raw(pg_url, "TRUNCATE flows_journal_events")
        assert "journal entries are append-only" in str(err.value.orig), err.value.orig
        assert store.db.read(
            lambda conn: conn.exec_driver_sql("SELECT count(*) FROM flows_journal_events").scalar()) == count
    finally:
        store.close()


def _without_new():
    shipped = _migrations.discover
    patch = pytest.MonkeyPatch()
    patch.setattr(_migrations, "discover", lambda *a, **k: [m for m in shipped(*a, **k) if m.id not in NEW])
    return patch


def test_a_store_of_the_previous_version_lists_and_applies_the_new_migrations(db_url):
    patch = _without_new()
    try:
        fencepost.open(db_url).close()
    finally:
        patch.undo()
    assert not set(NEW) & ledger_of(db_url)
    code, out, err = _cli("--db", db_url, "migrations", "status", "--json")
    assert code == 0, (out, err)
    states = {r["id"]: r["state"] for r in json.loads(out)}
    assert states[4] == "pending" and states[1008] == "pending" and states[1007] == "applied", states
    fencepost.open(db_url).close()  # a writable open applies them
    assert set(NEW) <= ledger_of(db_url)
    code, out, _ = _cli("--db", db_url, "migrations", "status", "--json")
    assert {r["id"]: r["state"] for r in json.loads(out)}[1008] == "applied", out
    if db_url.startswith("postgresql"):
        with pytest.raises(DBAPIError):
            _raw(db_url, "TRUNCATE flows_runs")
