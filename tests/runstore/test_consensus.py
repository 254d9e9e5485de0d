"""SqlConsensus conformance and the run store's delegation to it (UPSTREAM-TESTS A8, B4 CC-01..07)."""

from __future__ import annotations

import pytest

from fencepost import (
    Activated,
    ClaimChanged,
    Claimed,
    ClaimLost,
    FenceLost,
    NotFound,
    Recovered,
    RunSnapshot,
    RunStoreError,
    SnapshotChanged,
    Transitioned,
    Updated,
)
from fencepost.journal import consensus as cs
from fencepost.journal.consensus import Lost, Rejected, Renewed, SqlConsensus
from fencepost.journal.owner import OwnerId
from fencepost.runstore import heartbeat

from .conftest import PENDING, A, activate_new, ev, fresh, lease, raw_exec, running

# CC owners: A(host-a,101), B(host-b,202), C(host-a,303)
CB = OwnerId("host-b", 202, "owner-b")
CC = OwnerId("host-a", 303, "owner-c")


def _w(store, fn):
    return store.db.write(fn)


def test_stale_cutoff_is_the_heartbeat_constant():
    assert cs.STALE_AFTER_MS == heartbeat.STALE_AFTER_MS


def test_claim_grants_once_and_ownership_blocks(mstore):
    """CC-01, CC-02."""
    k, r = SqlConsensus(), fresh()
    assert _w(mstore, lambda c: k.claim(c, r, A, 0)) == cs.Claimed(0)
    assert _w(mstore, lambda c: k.claim(c, r, CB, 0)) == Rejected("already_claimed")
    assert _w(mstore, lambda c: k.activate(c, r, A, 0, 0)) == cs.Activated()
    assert _w(mstore, lambda c: k.claim(c, r, CB, 0)) == Rejected("owner_held")


def test_a_grant_is_spent_once(mstore):
    """CC-03."""
    k, r = SqlConsensus(), fresh()
    _w(mstore, lambda c: k.claim(c, r, A, 5))
    assert _w(mstore, lambda c: k.activate(c, r, A, 6, 6)) == Lost()
    assert _w(mstore, lambda c: k.activate(c, r, CB, 5, 5)) == Lost()
    assert _w(mstore, lambda c: k.activate(c, fresh(), A, 5, 5)) == Lost()
    assert _w(mstore, lambda c: k.activate(c, r, A, 5, 5)) == cs.Activated()
    assert _w(mstore, lambda c: k.activate(c, r, A, 5, 5)) == Lost()


def test_lease_heartbeat_is_monotonic_and_owner_only(mstore):
    """CC-04."""
    k, r, claim_only = SqlConsensus(), fresh(), fresh()
    _w(mstore, lambda c: k.claim(c, r, A, 100))
    _w(mstore, lambda c: k.activate(c, r, A, 100, 100))
    assert _w(mstore, lambda c: k.heartbeat(c, r, A, 250)) == Renewed(250)
    assert _w(mstore, lambda c: k.heartbeat(c, r, A, 150)) == Renewed(250)
    assert _w(mstore, lambda c: k.heartbeat(c, r, CB, 300)) == Lost()
    assert _w(mstore, lambda c: k.heartbeat(c, fresh(), A, 300)) == Lost()
    _w(mstore, lambda c: k.claim(c, claim_only, A, 0))
    assert _w(mstore, lambda c: k.heartbeat(c, claim_only, A, 300)) == Lost()


def test_release_semantics(mstore):
    """CC-05: a stranger's release changes nothing; the owner's frees the run; unknown is a no-op."""
    k, r, p = SqlConsensus(), fresh(), fresh()
    _w(mstore, lambda c: k.claim(c, r, A, 0))
    _w(mstore, lambda c: k.activate(c, r, A, 0, 0))
    _w(mstore, lambda c: k.release(c, r, CB))
    assert _w(mstore, lambda c: k.heartbeat(c, r, A, 1)) == Renewed(1)
    _w(mstore, lambda c: k.release(c, r, A))
    assert _w(mstore, lambda c: k.heartbeat(c, r, A, 2)) == Lost()
    assert lease(mstore, r) is None  # pruned
    _w(mstore, lambda c: k.release(c, fresh(), A))
    _w(mstore, lambda c: k.claim(c, p, A, 0))
    _w(mstore, lambda c: k.release(c, p, A))
    assert _w(mstore, lambda c: k.claim(c, p, CB, 0)) == cs.Claimed(0)


def test_steal_conformance(mstore):
    """CC-06."""
    k, r, unowned, by_c = SqlConsensus(), fresh(), fresh(), fresh()
    for run, o in ((r, A), (by_c, CC)):
        _w(mstore, lambda c, run=run, o=o: k.claim(c, run, o, 0))
        _w(mstore, lambda c, run=run, o=o: k.activate(c, run, o, 0, 0))
    _w(mstore, lambda c: k.claim(c, unowned, CC, 0))
    assert _w(mstore, lambda c: k.steal(c, r, CB, 1, ev(A, CB, 1))) == Rejected("owner_live")
    n = 30_001
    for bad in (ev(CB, CB, n), ev(A, CB, n - 1), ev(A, CB, n, "same-host-pid-dead")):
        assert _w(mstore, lambda c, bad=bad: k.steal(c, r, CB, n, bad)) == Rejected("evidence_invalid")
    assert _w(mstore, lambda c: k.steal(c, r, CC, n, ev(A, CC, n, "cross-host-unreachable-stale"))) == Rejected(
        "evidence_invalid")
    assert _w(mstore, lambda c: k.steal(c, unowned, CB, n, ev(A, CB, n))) == Rejected("evidence_invalid")
    assert _w(mstore, lambda c: k.steal(c, by_c, CB, n, ev(A, CB, n))) == Rejected("evidence_invalid")
    assert _w(mstore, lambda c: k.steal(c, r, CB, n, ev(A, CB, n))) == cs.Claimed(n)
    assert _w(mstore, lambda c: k.steal(c, r, CC, n, ev(A, CC, n, "same-host-pid-dead"))) == Rejected(
        "already_claimed")
    assert _w(mstore, lambda c: k.activate(c, r, CB, n, n)) == cs.Activated()
    assert _w(mstore, lambda c: k.steal(c, by_c, CB, n, ev(CC, CB, n, "lease-expired"))) == cs.Claimed(n)


def test_recover_conformance(mstore):
    """CC-07."""
    k, r = SqlConsensus(), fresh()
    _w(mstore, lambda c: k.claim(c, r, A, 0))
    n = 30_001
    assert _w(mstore, lambda c: k.recover(c, r, A, 0, CB, n, ev(A, CB, n - 1))) == Rejected("evidence_invalid")
    assert _w(mstore, lambda c: k.recover(c, r, CB, 0, CB, n, ev(CB, CB, n))) == Rejected("claim_changed")
    assert _w(mstore, lambda c: k.recover(c, r, A, 1, CB, n, ev(A, CB, n))) == Rejected("claim_changed")
    assert _w(mstore, lambda c: k.recover(c, fresh(), A, 0, CB, n, ev(A, CB, n))) == Rejected("claim_changed")
    assert _w(mstore, lambda c: k.recover(c, r, A, 0, CB, 30_000, ev(A, CB, 30_000))) == Rejected("claim_fresh")
    assert _w(mstore, lambda c: k.recover(c, r, A, 0, CB, n, ev(A, CB, n))) == cs.Recovered()
    assert _w(mstore, lambda c: k.claim(c, r, CB, n)) == cs.Claimed(n)


def _holds(store, run_id, owner):
    return store.db.write(lambda c: store.consensus.guard(c, run_id, owner))


def test_claim_is_not_ownership_and_suspension_releases(mstore):
    """OC-01."""
    runs, r = mstore.runs, fresh()
    runs.create(r, "{}")
    assert runs.claim(r, PENDING, A, 0) == Claimed(0)
    assert not _holds(mstore, r, A)
    assert runs.activate(r, A, 0, PENDING) == Activated()
    assert _holds(mstore, r, A) and not _holds(mstore, r, CB)
    assert runs.heartbeat(r, A, 5) == Updated(5)
    assert runs.transition_owned(r, A, "suspended") == Transitioned()
    assert not _holds(mstore, r, A)
    assert runs.heartbeat(r, A, 6) == FenceLost()


def test_self_re_own_and_takeover_move_the_lease(store, clock):
    """OC-02, OC-03."""
    runs = store.runs
    runs.create("r", "{}")
    runs.claim_and_own("r", PENDING, A, 0)
    activate_new(store, "s", A, 0)
    clock.set(30_001)
    assert runs.claim_and_own("r", running(A, 0), A, 30_001) == Activated()
    assert runs.get("r").heartbeat_at_ms == 30_001 and _holds(store, "r", A)
    assert runs.heartbeat("r", A, 30_002) == Updated(30_002)
    assert runs.steal("s", running(A, 0), CB, 30_001, ev(A, CB, 30_001)) == Claimed(30_001)
    assert _holds(store, "s", A)
    assert runs.activate("s", CB, 30_001, running(A, 0)) == Activated()
    assert not _holds(store, "s", A) and _holds(store, "s", CB)
    assert runs.heartbeat("s", A, 30_001) == FenceLost() and runs.heartbeat("s", CB, 30_001) == Updated(30_001)
    activate_new(store, "t", A, 30_001)
    clock.set(60_002)
    assert runs.claim_and_own("t", running(A, 30_001), CB, 60_002, ev(A, CB, 60_002)) == Activated()
    assert _holds(store, "t", CB) and not _holds(store, "t", A)


def test_abandon_and_recover_free_the_lease(store, clock):
    """OC-04."""
    runs = store.runs
    runs.create("r", "{}")
    runs.claim("r", PENDING, A, 0)
    runs.abandon_claim("r", A, 0)
    assert runs.claim("r", PENDING, A, 0) == Claimed(0)
    clock.set(30_001)
    obs = OwnerId("host-a", 303, "observer")
    assert runs.recover_claim("r", A, 0, obs, 30_001, ev(A, obs, 30_001)) == Recovered()
    assert runs.get("r").claimant is None
    assert runs.claim("r", PENDING, CB, 30_001) == Claimed(30_001)


def test_lease_claimed_behind_the_store_is_snapshot_changed(store):
    """OC-06."""
    store.runs.create("r", "{}")
    store.db.write(lambda c: store.consensus.claim(c, "r", CB, 0))
    assert store.runs.claim("r", PENDING, A, 0) == SnapshotChanged()
    assert store.runs.claim_and_own("r", PENDING, A, 0) == SnapshotChanged()


class _NeverActivates(SqlConsensus):
    def activate(self, conn, run_id, owner, granted_at_ms, now_ms):
        return Lost()


def test_lost_activation_compensates_with_a_release(db_url, clock):
    """OC-07: an injected strategy (fencepost.open(consensus=...)) that never activates."""
    import fencepost

    with fencepost.open(db_url, clock=clock, consensus=_NeverActivates()) as store:
        store.runs.create("r", "{}")
        assert store.runs.claim_and_own("r", PENDING, A, 0) == SnapshotChanged()
        assert store.db.write(lambda c: store.consensus.claim(c, "r", CB, 1)) == cs.Claimed(1)


def test_lease_released_behind_the_store_is_claim_lost(store):
    """OC-08, OC-09."""
    store.runs.create("r", "{}")
    store.runs.claim("r", PENDING, A, 0)
    raw_exec(store, "DELETE FROM flows_consensus_leases WHERE run_id = 'r'")
    assert store.runs.activate("r", A, 0, PENDING) == ClaimLost()
    assert store.runs.get("r").claimant is None
    store.runs.create("m", "{}")
    store.runs.claim("m", PENDING, A, 0)
    assert store.runs.activate("m", A, 0, RunSnapshot("suspended", None, None)) == SnapshotChanged()
    assert store.runs.get("m").claimant is None
    assert store.db.write(lambda c: store.consensus.claim(c, "m", CB, 0)) == cs.Claimed(0)


def test_lease_renewed_behind_the_store_refuses_takeover(store, clock):
    """OC-10, OC-11."""
    activate_new(store, "r", A)
    store.db.write(lambda c: store.consensus.heartbeat(c, "r", A, 30_001))
    clock.set(30_001)
    assert store.runs.steal("r", running(A, 0), CB, 30_001, ev(A, CB, 30_001)) == SnapshotChanged()
    assert store.runs.claim_and_own("r", running(A, 0), CB, 30_001, ev(A, CB, 30_001)) == SnapshotChanged()
    store.runs.create("c", "{}")
    store.runs.claim("c", PENDING, A, 0)
    raw_exec(store, "DELETE FROM flows_consensus_leases WHERE run_id = 'c'")
    obs = OwnerId("host-a", 303, "observer")
    assert store.runs.recover_claim("c", A, 0, obs, 30_001, ev(A, obs, 30_001)) == ClaimChanged()


def test_row_and_lease_disagreement_is_fence_lost(store):
    """OC-12, OC-13, OC-14."""
    raw_exec(store, "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms, heartbeat_at_ms, "
                    "owner_host_id, owner_pid, owner_nonce) VALUES ('raw', 'running', '{}', 0, 0, 'host-a', 101, "
                    "'owner-a')")
    assert store.runs.transition_owned("raw", A, "completed") == FenceLost()
    assert store.runs.get("raw").status == "running"
    activate_new(store, "moved", A)
    raw_exec(store, "UPDATE flows_runs SET status='suspended', owner_host_id=NULL, owner_pid=NULL, owner_nonce=NULL, "
                    "heartbeat_at_ms=NULL WHERE run_id = 'moved'")
    assert store.runs.heartbeat("moved", A, 1) == FenceLost()
    activate_new(store, "deleted", A)
    raw_exec(store, "DELETE FROM flows_runs WHERE run_id = 'deleted'")
    assert store.runs.heartbeat("deleted", A, 1) == NotFound()


def test_dropped_lease_table_is_persistence_failed_and_writes_nothing(store):
    """OC-15, SC-01."""
    activate_new(store, "r", A)
    store.runs.create("p", "{}")
    raw_exec(store, "DROP TABLE flows_consensus_leases")
    for call in (lambda: store.runs.claim("p", PENDING, A, 0),
                 lambda: store.runs.transition_owned("r", A, "completed")):
        with pytest.raises(RunStoreError) as e:
            call()
        assert e.value.code == "persistence_failed"
    assert store.runs.get("r").status == "running"
    assert store.runs.get("p").claimant is None


class _Failing(SqlConsensus):
    def __init__(self, exc):
        self.exc = exc

    def claim(self, conn, run_id, claimant, now_ms):
        raise self.exc


@pytest.mark.parametrize("exc,code", [
    (RuntimeError("sk-live-SECRET"), "persistence_failed"),
    (__import__("fencepost._durable", fromlist=["DbFailure"]).DbFailure("constraint", "23505"), "constraint"),
], ids=["defect", "db-constraint"])
def test_failing_strategy_is_a_store_error_without_values(db_url, clock, exc, code):
    """OC-16: a strategy failure becomes RunStoreError; no secret text; the row is untouched."""
    import fencepost

    with fencepost.open(db_url, clock=clock, consensus=_Failing(exc)) as store:
        store.runs.create("r", "{}")
        with pytest.raises(RunStoreError) as e:
            store.runs.claim("r", PENDING, A, 0)
        assert e.value.code == code and "SECRET" not in str(e.value) and "SECRET" not in repr(e.value.cause)
        row = store.runs.get("r")
        assert (row.status, row.owner, row.claimant, row.heartbeat_at_ms) == ("pending", None, None, None)


class _RefusesClaims(SqlConsensus):
    def __init__(self):
        self.refuse = False

    def claim(self, conn, run_id, claimant, now_ms):
        return Rejected("unavailable") if self.refuse else super().claim(conn, run_id, claimant, now_ms)


def test_refused_re_grant_leaves_the_old_lease_and_no_fact(db_url, clock):
    """Re-owning one's own stale run runs release + claim in a savepoint: a refusal undoes the release."""
    import fencepost

    from .conftest import facts

    strategy = _RefusesClaims()
    with fencepost.open(db_url, clock=clock, consensus=strategy) as store:
        store.runs.create("r", "{}")
        store.runs.claim_and_own("r", PENDING, A, 0)
        clock.set(30_001)
        strategy.refuse = True
        assert store.runs.claim_and_own("r", running(A, 0), A, 30_001) == SnapshotChanged()
        assert store.db.write(lambda c: store.consensus.guard(c, "r", A))
        assert [f[0] for f in facts(store, "r")] == ["claimed", "activated"]
        assert store.runs.heartbeat("r", A, 30_001) == Updated(30_001)
