"""Issue 10 defect 7: deleting a run by raw SQL releases its lease in the same transaction.

Before, the ``flows_consensus_leases`` row outlived its run: a run recreated under the same id could
never be claimed (``SnapshotChanged`` forever: the lease said someone held it) and the deleted run's
owner still passed the journal fence. A trigger on ``flows_runs`` now deletes the lease row with the
run, so the recreated run is claimable and the old owner's fenced append is ``fence_lost``.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

import fencepost
from fencepost.errors import JournalError
from fencepost.journal import OwnerId

A = OwnerId("host-a", 101, "owner-a")
B = OwnerId("host-b", 202, "owner-b")


def _lease(store: fencepost.Store, run_id: str) -> tuple | None:
    row = store.db.read(lambda c: c.execute(
        text("SELECT owner_nonce, claim_nonce FROM flows_consensus_leases WHERE run_id = :r"), {"r": run_id}
    ).first())
    return None if row is None else tuple(row)


def _take(store: fencepost.Store, run_id: str, how: str, clock) -> None:
    snap = store.runs.get(run_id).snapshot()
    if how == "running":
        store.runs.claim_and_own(run_id, snap, A, clock.now_ms())
        assert _lease(store, run_id) == ("owner-a", None)
    else:
        store.runs.claim(run_id, snap, A, clock.now_ms())
        assert _lease(store, run_id) == (None, "owner-a")


@pytest.mark.parametrize("how", ["running", "claimed"])
def test_raw_delete_releases_the_lease_and_the_recreated_run_is_claimable(store: fencepost.Store, raw, clock,
                                                                          how: str) -> None:
    store.runs.create("r1", "{}")
    store.runs.create("other", "{}")
    _take(store, "r1", how, clock)
    _take(store, "other", how, clock)
    raw.execute(text("DELETE FROM flows_runs WHERE run_id = 'r1'"))
    # Same transaction: the lease is gone before the delete commits, as seen from inside it.
    assert raw.execute(text("SELECT count(*) FROM flows_consensus_leases WHERE run_id = 'r1'")).scalar() == 0
    raw.commit()
    assert _lease(store, "r1") is None
    assert _lease(store, "other") is not None  # only the deleted run's lease

    with pytest.raises(JournalError) as err:
        store.journal.append("r1", "late", {}, owner=A, source_id="engine")
    assert err.value.code == "fence_lost"

    store.runs.create("r1", "{}")
    outcome = store.runs.claim_and_own("r1", store.runs.get("r1").snapshot(), B, clock.now_ms())
    assert type(outcome).__name__ == "Activated", outcome
    assert store.runs.get("r1").owner == B
    assert store.journal.append("r1", "mine", {}, owner=B, source_id="engine").seq == 0
    with pytest.raises(JournalError) as err:
        store.journal.append("r1", "late", {}, owner=A, source_id="engine")
    assert err.value.code == "fence_lost"


def test_a_rolled_back_delete_keeps_the_lease(store: fencepost.Store, raw, clock) -> None:
    store.runs.create("r1", "{}")
    _take(store, "r1", "running", clock)
    raw.execute(text("DELETE FROM flows_runs WHERE run_id = 'r1'"))
    raw.rollback()
    assert _lease(store, "r1") == ("owner-a", None)
    assert store.journal.append("r1", "still-mine", {}, owner=A, source_id="engine").seq == 0


def test_a_lease_without_a_run_is_left_alone(store: fencepost.Store, raw, clock) -> None:
    """The journal's fence is usable without a run row (imports, tests): only a run's own delete
    releases a lease; deleting other runs, or updating this one, does not."""
    store.db.write(lambda c: c.execute(text(
        "INSERT INTO flows_consensus_leases (run_id, owner_host_id, owner_pid, owner_nonce, granted_at_ms,"
        " heartbeat_at_ms) VALUES ('free', 'host-a', 101, 'owner-a', 0, 0)")))
    store.runs.create("x", "{}")
    raw.execute(text("UPDATE flows_runs SET state_json = '[1]' WHERE run_id = 'x'"))
    raw.execute(text("DELETE FROM flows_runs WHERE run_id = 'x'"))
    raw.commit()
    assert _lease(store, "free") == ("owner-a", None)
    assert store.journal.append("free", "ok", {}, owner=A, source_id="engine").seq == 0
