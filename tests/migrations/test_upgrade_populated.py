"""Upgrading a populated store from the oldest schema fencepost has shipped: journal 0001..0003 and
run store 1001..1002 (runs, leases, revisions). Rows written under it keep their revisions and their
ownership through every later migration. Both backends."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text

from fencepost import Activated, Claimed, FenceLost, JournalError, LivenessEvidence, OwnerId, Position, Updated
from fencepost._durable import Database
from fencepost._migrations import _LEDGER, STORE_NAMESPACES, discover, migrate
from fencepost._store import Store
from fencepost.clock import ManualClock

OLDEST = 1002  # every migration above this id came later

A = OwnerId("host-a", 101, "owner-a")  # alive, heartbeat 300 000
B = OwnerId("host-a", 202, "owner-b")  # dead, heartbeat 0
C = OwnerId("host-b", 303, "owner-c")  # the successor


def _apply_oldest(db: Database) -> list[int]:
    """Migrate ``db`` to the oldest shipped schema only; return the ids left for ``migrate``."""
    every = discover(db.backend.migration_suffix, STORE_NAMESPACES)
    old = [m for m in every if m.id <= OLDEST]

    def body(conn) -> None:
        if db.backend.name == "postgresql":
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{db.schema}"')
        conn.exec_driver_sql(_LEDGER[db.backend.name])
        for m in old:
            for statement in db.backend.split_script(m.script):
                conn.exec_driver_sql(statement)
            conn.execute(text("INSERT INTO flows_migrations (migration_id, name) VALUES (:i, :n)"),
                         {"i": m.id, "n": m.recorded_name})

    db.write(body)
    return [m.id for m in every if m.id > OLDEST]


@pytest.fixture
def db(db_url: str):
    database = Database(db_url)
    try:
        yield database
    finally:
        database.dispose()


def test_runs_written_under_the_oldest_schema_keep_their_revisions(db: Database) -> None:
    """ER-01 analogue (revisions came with the first run-store schema, so nothing needs a backfill):
    pending runs a and b written under the oldest schema are revisions 1 and 2; upgrading applies
    every later migration, keeps them, deletes nothing, and the source stays 32 lowercase hex at 2."""
    later = _apply_oldest(db)
    insert = text("INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES (:r, 'pending', '{}', 0)")
    db.write(lambda c: [c.execute(insert, {"r": r}) for r in ("a", "b")])
    assert migrate(db) == later and later
    changes = db.read(lambda c: c.exec_driver_sql(
        "SELECT run_id, revision, deleted FROM flows_run_changes ORDER BY revision").all())
    assert [(r, int(v), int(d)) for r, v, d in changes] == [("a", 1, 0), ("b", 2, 0)]
    source, revision = db.read(lambda c: c.exec_driver_sql("SELECT source, revision FROM flows_run_source").one())
    assert re.fullmatch(r"[0-9a-f]{32}", source) and int(revision) == 2
    store = Store(db, clock=ManualClock(0))
    assert [c.run_id for c in store.feed.changes_since(Position(source, 0)).changes] == ["a", "b"]


def test_owned_runs_written_under_the_oldest_schema_stay_fenced_after_the_upgrade(db: Database) -> None:
    """CU-01 analogue (the lease table came with the first journal schema): running rows with their
    leases, one live (heartbeat 300 000), one stale (heartbeat 0), written under the oldest schema;
    after the upgrade, at 300 000: the live owner's heartbeat(300 001) is Updated and its fenced
    append Accepted; a successor steals the stale run with ``lease-expired`` evidence
    (``Claimed(300000)``), activates, appends; the dead owner's append is ``fence_lost`` and its
    heartbeat ``FenceLost``."""
    later = _apply_oldest(db)

    def seed(conn) -> None:
        for run_id, owner, hb in (("live", A, 300_000), ("stale", B, 0)):
            o = {"r": run_id, "h": owner.host_id, "p": owner.pid, "n": owner.nonce, "hb": hb}
            conn.execute(text(
                "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms, started_at_ms, owner_host_id,"
                " owner_pid, owner_nonce, heartbeat_at_ms) VALUES (:r, 'running', '{}', 0, 0, :h, :p, :n, :hb)"), o)
            conn.execute(text(
                "INSERT INTO flows_consensus_leases (run_id, owner_host_id, owner_pid, owner_nonce, granted_at_ms,"
                " heartbeat_at_ms) VALUES (:r, :h, :p, :n, 0, :hb)"), o)

    db.write(seed)
    assert migrate(db) == later
    store = Store(db, clock=ManualClock(300_000))
    runs, journal = store.runs, store.journal
    assert runs.heartbeat("live", A, 300_001) == Updated(300_001)
    assert type(journal.append("live", "t", {}, owner=A, source_id="w")).__name__ == "Accepted"
    row = runs.get("stale")
    assert runs.steal("stale", row, C, 300_000, LivenessEvidence(B, 300_000, "lease-expired")) == Claimed(300_000)
    assert runs.activate("stale", C, 300_000, row) == Activated()
    assert type(journal.append("stale", "t", {}, owner=C, source_id="w")).__name__ == "Accepted"
    with pytest.raises(JournalError) as e:
        journal.append("stale", "t", {}, owner=B, source_id="d")
    assert e.value.code == "fence_lost"
    assert runs.heartbeat("stale", B, 300_000) == FenceLost()
