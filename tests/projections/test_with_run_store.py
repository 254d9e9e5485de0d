"""Both built-in projections fed by the real run store (claims, activation, settle, steal)."""

from __future__ import annotations

from sqlalchemy import text

from fencepost import LivenessEvidence, OwnerId, RunSnapshot
from fencepost.projections import OwnershipHistory, ProjectionBuilder, RunsByStatus

A = OwnerId("host-a", 101, "owner-a")
C = OwnerId("host-b", 303, "owner-c")
PENDING = RunSnapshot("pending", None, None)


def test_run_store_operations_reach_both_projections(store, clock, target_url):
    runs = store.runs
    runs.create("done", "{}")
    claimed = runs.claim("done", PENDING, A, 0)
    runs.activate("done", A, claimed.claimed_at_ms, PENDING)
    runs.transition_owned("done", A, "completed")
    runs.create("stolen", "{}")
    runs.claim_and_own("stolen", PENDING, A, 0)
    runs.create("waiting", "{}")
    runs.request_cancel("waiting", 0)

    status_builder = ProjectionBuilder(store, target_url, RunsByStatus())
    history_builder = ProjectionBuilder(store, target_url, OwnershipHistory())
    try:
        status_builder.catch_up()
        history_builder.catch_up()
        clock.advance(31_000)
        stolen = runs.steal("stolen", RunSnapshot("running", A, 0), C, 31_000,
                            LivenessEvidence(A, 31_000, "cross-host-unreachable-stale"))
        assert stolen.__class__.__name__ == "Claimed"
        status_builder.catch_up()
        history_builder.catch_up()

        rows = status_builder.target.read(lambda conn: {r[0]: tuple(r[1:]) for r in conn.execute(text(
            "SELECT run_id, status, owner_host_id, cancel_requested_at_ms FROM projection_runs_by_status"))})
        expected = {}
        for snap in store.feed.read(["done", "stolen", "waiting"]).snapshots:
            owner = snap.owner.host_id if snap.owner else None
            cancel = snap.cancellation.requested_at_ms if snap.cancellation else None
            expected[snap.run_id] = (snap.status, owner, cancel)
        assert rows == expected
        assert rows["done"][0] == "completed" and rows["waiting"][2] == 0

        intervals = history_builder.target.read(lambda conn: conn.execute(text(
            "SELECT run_id, owner_host_id, opened_by, activated_position IS NOT NULL, closed_by "
            "FROM projection_ownership_history ORDER BY run_id, opened_position")).all())
        assert [tuple(r) for r in intervals] == [
            ("done", "host-a", "claimed", True, "released"),
            # A steal is a claim: A still owns the run until the thief activates (issue 11).
            ("stolen", "host-a", "claimed", True, None),
            ("stolen", "host-b", "stolen", False, None),
        ]
        assert status_builder.status().lag == 0 and history_builder.status().lag == 0
    finally:
        status_builder.close()
        history_builder.close()
