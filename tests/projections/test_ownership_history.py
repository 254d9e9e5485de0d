"""OwnershipHistory: ownership intervals per run from flows.consensus.* facts, in journal position order."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from sqlalchemy import text

import fencepost
from fencepost.clock import ManualClock
from fencepost.journal import companion_stream
from fencepost.journal.owner import OwnerId
from fencepost.projections import OwnershipHistory, ProjectionBuilder

A = OwnerId("host-a", 11, "nonce-a")
B = OwnerId("host-b", 22, "nonce-b")


def _fact(store, run_id: str, kind: str, owner: OwnerId, granted: int | None) -> None:
    def body(conn):
        store.journal.append_in(
            conn, companion_stream(run_id), f"flows.consensus.{kind}",
            {"runId": run_id, "owner": owner.to_json(), "grantedAtMs": granted},
            source_id="flows.run-store", meta={"runId": run_id},
        )

    store.db.write(body)


def _noise(store, run_id: str) -> None:
    """An engine fact on the run's own stream: not a consensus fact, skipped by the projection."""
    store.db.write(lambda conn: store.journal.append_in(
        conn, run_id, "flows.engine.run-decision", {"decision": "wake-scheduled"}, source_id="engine"))


def _intervals(builder: ProjectionBuilder) -> dict[str, list[tuple]]:
    rows = builder.target.read(lambda conn: conn.execute(text(
        "SELECT run_id, owner_host_id, opened_by, granted_at_ms, activated_position IS NOT NULL, closed_by "
        "FROM projection_ownership_history ORDER BY run_id, opened_position"
    )).all())
    out: dict[str, list[tuple]] = {}
    for row in rows:
        out.setdefault(row[0], []).append(tuple(row[1:]))
    return out


def _history(store) -> None:
    """REFERENCE 3.5 sequences, interleaved across runs."""
    _fact(store, "two-phase", "claimed", A, 0)
    _fact(store, "stolen", "claimed", A, 0)
    _noise(store, "two-phase")
    _fact(store, "two-phase", "activated", A, 0)
    _fact(store, "stolen", "activated", A, 0)
    _fact(store, "recovered", "claimed", A, 5)
    _fact(store, "stolen", "stolen", B, 40_000)
    _fact(store, "stolen", "activated", B, 40_000)
    _fact(store, "two-phase", "released", A, None)
    _fact(store, "recovered", "expired", A, 5)
    _fact(store, "re-owned", "claimed", A, 0)
    _fact(store, "re-owned", "activated", A, 0)
    _fact(store, "re-owned", "released", A, None)
    _fact(store, "re-owned", "claimed", A, 31_000)
    _fact(store, "re-owned", "activated", A, 31_000)
    _noise(store, "re-owned")


EXPECTED = {
    "two-phase": [("host-a", "claimed", 0, True, "released")],
    "stolen": [("host-a", "claimed", 0, True, "stolen"), ("host-b", "stolen", 40_000, True, None)],
    "recovered": [("host-a", "claimed", 5, False, "expired")],
    "re-owned": [("host-a", "claimed", 0, True, "released"), ("host-a", "claimed", 31_000, True, None)],
}


def test_intervals_follow_the_consensus_facts_in_position_order(store, target_url):
    _history(store)
    with ProjectionBuilder(store, target_url, OwnershipHistory()) as builder:
        result = builder.catch_up()
        assert (result.applied, result.rejected, result.rebuilt) == (14, 0, False)
        assert _intervals(builder) == EXPECTED
        status = builder.status()
        # The watermark is the journal head, past the trailing non-consensus entry.
        assert status.feed == "consensus" and status.lag == 0 and status.applied_revision == 16


def test_incremental_catch_up_equals_one_pass_from_scratch(store, target_url, make_db_url):
    with ProjectionBuilder(store, target_url, OwnershipHistory(), batch_size=3) as builder:
        _fact(store, "stolen", "claimed", A, 0)
        builder.catch_up()
        _fact(store, "stolen", "activated", A, 0)
        _fact(store, "stolen", "stolen", B, 40_000)
        builder.catch_up()
        _fact(store, "stolen", "activated", B, 40_000)
        _fact(store, "stolen", "released", B, None)
        builder.catch_up()
        incremental = _intervals(builder)
    with ProjectionBuilder(store, make_db_url(), OwnershipHistory()) as fresh:
        fresh.catch_up()
        assert _intervals(fresh) == incremental
    assert incremental == {"stolen": [("host-a", "claimed", 0, True, "stolen"),
                                      ("host-b", "stolen", 40_000, True, "released")]}


def test_rotation_rebuilds_the_ownership_history(store, target_url):
    _history(store)
    with ProjectionBuilder(store, target_url, OwnershipHistory()) as builder:
        builder.catch_up()
        rotated = store.feed.rotate_source()
        result = builder.catch_up()
        assert result.rebuilt and result.applied == 14
        assert _intervals(builder) == EXPECTED
        sources = builder.target.read(lambda conn: conn.execute(
            text("SELECT DISTINCT source FROM projection_ownership_history")).scalars().all())
        assert sources == [rotated.source]
        assert builder.status().last_rebuild.reason == "source_changed"


def test_restored_copy_that_wrote_other_facts_past_the_checkpoint_is_detected(tmp_path, backend, make_db_url):
    """A restored older SQLite copy that then appended other facts reaches the checkpoint's position
    again with different entries: the entry hash at the checkpoint no longer matches, so the
    builder rebuilds instead of silently continuing (source is SQLite, target is ``backend``)."""
    src = tmp_path / "source.db"
    url = f"sqlite:///{src}"
    target_url = make_db_url()
    store = fencepost.open(url, clock=ManualClock(0))
    _fact(store, "r", "claimed", A, 0)
    with sqlite3.connect(src) as live, sqlite3.connect(tmp_path / "backup.db") as copy:
        live.backup(copy)
    live.close()
    copy.close()
    _fact(store, "r", "activated", A, 0)
    _fact(store, "r", "released", A, None)
    with ProjectionBuilder(store, target_url, OwnershipHistory()) as builder:
        builder.catch_up()
        assert _intervals(builder) == {"r": [("host-a", "claimed", 0, True, "released")]}
    store.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{src}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(tmp_path / "backup.db", src)

    store = fencepost.open(url, clock=ManualClock(0))
    try:
        _fact(store, "r", "stolen", B, 40_000)
        _fact(store, "r", "activated", B, 40_000)
        with ProjectionBuilder(store, target_url, OwnershipHistory()) as builder:
            assert builder.status().pending_rebuild == "journal_diverged"
            result = builder.catch_up()
            assert result.rebuilt
            assert builder.status().last_rebuild.reason == "journal_diverged"
            # (a steal with nobody owning the run is a contradiction replay reports; the
            # projection records it as it comes: A's pending claim is superseded by B's)
            assert _intervals(builder) == {"r": [("host-a", "claimed", 0, False, "superseded"),
                                                 ("host-b", "stolen", 40_000, True, None)]}
    finally:
        store.close()
