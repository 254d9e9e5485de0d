"""Review: OwnershipHistory counts only the run store's own facts, as ``journal replay`` does.

Any journal writer may name an entry ``flows.consensus.activated``: an owner on its run's own
stream (fenced ``append``), anyone through ``append_unfenced`` on any stream. Such an entry is not
a transition the consensus strategy granted; an auditor's ownership history must not show it.
"""

from __future__ import annotations

from sqlalchemy import text

import fencepost
from fencepost import OwnerId, RunSnapshot
from fencepost.journal import companion_stream
from fencepost.journal.replay import ownership_history
from fencepost.projections import OwnershipHistory, ProjectionBuilder

A = OwnerId("host-a", 11, "nonce-a")
MALLORY = OwnerId("host-m", 66, "nonce-m")


def _intervals(builder: ProjectionBuilder) -> list[tuple]:
    return [tuple(r) for r in builder.target.read(lambda conn: conn.execute(text(
        "SELECT run_id, owner_host_id, opened_by, closed_by FROM projection_ownership_history "
        "ORDER BY run_id, opened_position")).all())]


def test_entries_named_like_consensus_facts_but_not_from_the_run_store_are_ignored(
        store: fencepost.Store, target_url: str) -> None:
    store.runs.create("victim", "{}")
    store.runs.create("mallory-run", "{}")
    pending = RunSnapshot("pending", None, None)
    for rid, owner in (("victim", A), ("mallory-run", MALLORY)):
        claimed = store.runs.claim(rid, pending, owner, 0)
        assert type(store.runs.activate(rid, owner, claimed.claimed_at_ms, pending)).__name__ == "Activated"
    forged = {"runId": "victim", "owner": MALLORY.to_json(), "grantedAtMs": 0}
    # The owner of another run journals look-alike facts on its own stream ...
    store.journal.append("mallory-run", "flows.consensus.released", {**forged, "owner": A.to_json(),
                                                                    "grantedAtMs": None},
                         owner=MALLORY, source_id="mallory")
    store.journal.append("mallory-run", "flows.consensus.activated", forged, owner=MALLORY, source_id="mallory")
    # ... and an unfenced writer on a stream of its choosing.
    store.journal.append_unfenced("elsewhere", "flows.consensus.stolen", forged, source_id="flows.run-store")
    # ... or on the victim's companion stream itself, under its own producer id.
    # (public appends refuse that stream outright; a raw in-transaction append stands in for a bug)
    store.db.write(lambda conn: store.journal.append_in(
        conn, companion_stream("victim"), "flows.consensus.stolen", forged, source_id="mallory"))

    with ProjectionBuilder(store, target_url, OwnershipHistory()) as builder:
        builder.catch_up()
        rows = _intervals(builder)
    assert rows == [("mallory-run", "host-m", "claimed", None), ("victim", "host-a", "claimed", None)]
    history = ownership_history(store, "victim")
    assert history.ok and [i.owner for i in history.intervals] == [A]
