"""Run-store claims, activation, steal, recover, heartbeat and transitions (UPSTREAM-TESTS A1)."""

from __future__ import annotations

from functools import partial

import pytest

from fencepost import (
    Abandoned,
    Activated,
    AlreadyClaimed,
    ClaimChanged,
    Claimed,
    ClaimFresh,
    ClaimLost,
    EvidenceRequired,
    FenceLost,
    HeartbeatFresh,
    LivenessUnconfirmed,
    NotFound,
    OwnerId,
    Recovered,
    RunSnapshot,
    RunStoreError,
    SnapshotChanged,
    Transitioned,
    Updated,
)
from fencepost.clock import ManualClock
from fencepost.runstore.heartbeat import HEARTBEAT_INTERVAL, SKEW_ALLOWANCE, STALE_AFTER, WRITE_TOLERANCE
from tests.conftest import race_threads

from .conftest import PENDING, A, B, C, activate_new, ev, running


def test_lifecycle_stamps_are_floored_store_clock_readings(db_url):
    """RS-01: created/started/finished come from the store clock, floored to integer ms."""
    import fencepost

    clock = ManualClock(10.5)
    with fencepost.open(db_url, clock=clock) as store:
        store.runs.create("r", "{}")
        assert store.runs.claim("r", PENDING, A, 10) == Claimed(10)
        assert store.runs.activate("r", A, 10, PENDING) == Activated()
        clock.advance(1)
        assert store.runs.transition_owned("r", A, "completed") == Transitioned()
        row = store.runs.get("r")
        assert (row.created_at_ms, row.started_at_ms, row.finished_at_ms) == (10, 10, 11)


def test_create_and_get_round_trip_every_column(runs):
    """RS-07: a fresh row is pending with everything else null and the state verbatim."""
    runs.create("run-round-trip", '{"cursor":1}')
    row = runs.get("run-round-trip")
    assert row.status == "pending" and row.created_at_ms == 0 and row.state_json == '{"cursor":1}'
    assert all(getattr(row, f) is None for f in (
        "started_at_ms", "finished_at_ms", "owner", "heartbeat_at_ms", "claimant", "claimed_at_ms",
        "parent_run_id", "cancel_requested_at_ms", "lineage_id", "round_ordinal", "cancel_acknowledgement"))


@pytest.mark.parametrize("rid", ["run-\ufffd", "run-\U0001F600"], ids=["replacement-char", "astral"])
def test_replacement_and_astral_run_ids_round_trip(runs, rid):
    """RS-04, RS-05."""
    runs.create(rid, "{}")
    assert runs.get(rid).run_id == rid


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
def test_concurrent_claims_of_one_snapshot_admit_exactly_one(store):
    """RS-09: two claimants race one pending snapshot; one Claimed, the other a loss."""
    store.runs.create("r", "{}")
    got = race_threads([partial(store.runs.claim, "r", PENDING, o, 0) for o in (A, B)])
    results = dict(zip((A, B), got, strict=True))
    kinds = sorted(type(v).__name__ for v in results.values())
    assert kinds[0] in ("AlreadyClaimed", "SnapshotChanged") and kinds[1] == "Claimed"


def test_claim_and_own_with_evidence_takes_over_and_fences_the_old_owner(store, clock):
    """RS-10."""
    activate_new(store, "r", A)
    clock.advance(31_000)
    assert store.runs.claim_and_own("r", running(A, 0), B, 31_000, ev(A, B, 31_000)) == Activated()
    row = store.runs.get("r")
    assert (row.status, row.owner, row.heartbeat_at_ms, row.claimant, row.claimed_at_ms) == (
        "running", B, 31_000, None, None)
    assert store.runs.heartbeat("r", A, 31_001) == FenceLost()


def test_claim_and_own_installs_any_named_owner(runs):
    """RS-11."""
    runs.create("r", "{}")
    other = OwnerId("engine-host", 404, "engine-to-spawn")
    assert runs.claim_and_own("r", PENDING, other, 0) == Activated()
    row = runs.get("r")
    assert row.owner == other and row.heartbeat_at_ms == 0


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
def test_concurrent_claim_and_own_admits_one_owner(store):
    """RS-12."""
    store.runs.create("r", "{}")
    got = race_threads([partial(store.runs.claim_and_own, "r", PENDING, o, 0) for o in (A, B)])
    results = dict(zip((A, B), got, strict=True))
    winners = [o for o, v in results.items() if v == Activated()]
    assert len(winners) == 1
    loser = next(v for o, v in results.items() if o not in winners)
    assert isinstance(loser, (HeartbeatFresh, SnapshotChanged))
    assert store.runs.get("r").owner == winners[0]


def test_claim_and_own_of_a_fresh_owner_is_heartbeat_fresh_not_evidence_required(store):
    """RS-13."""
    activate_new(store, "r", A)
    assert store.runs.claim_and_own("r", running(A, 0), B, 0) == HeartbeatFresh()
    row = store.runs.get("r")
    assert (row.owner, row.heartbeat_at_ms) == (A, 0)


def test_stale_owner_without_evidence_is_evidence_required_every_time(store, clock):
    """RS-14 (B12)."""
    activate_new(store, "r", A)
    clock.advance(31_000)
    for _ in range(2):
        assert store.runs.claim_and_own("r", running(A, 0), B, 31_000) == EvidenceRequired()
    assert store.runs.get("r").owner == A


def test_suspended_run_is_taken_with_its_fresh_snapshot_only(store, clock):
    """RS-15."""
    activate_new(store, "r", A)
    assert store.runs.transition_owned("r", A, "suspended") == Transitioned()
    clock.advance(30_001)
    assert store.runs.claim_and_own("r", running(A, 0), B, 30_001) == SnapshotChanged()
    assert store.runs.claim_and_own("r", store.runs.get("r"), B, 30_001) == Activated()
    assert store.runs.get("r").owner == B


def test_completed_run_cannot_be_taken_with_an_old_running_snapshot(store, clock):
    """RS-16."""
    activate_new(store, "r", A)
    store.runs.transition_owned("r", A, "completed")
    clock.advance(30_001)
    assert store.runs.claim_and_own("r", running(A, 0), B, 30_001) == SnapshotChanged()
    row = store.runs.get("r")
    assert (row.status, row.owner) == ("completed", None)


def test_original_pending_snapshot_is_stale_after_suspension(store):
    """RS-17."""
    activate_new(store, "r", A)
    store.runs.transition_owned("r", A, "suspended")
    assert store.runs.claim_and_own("r", PENDING, B, 0) == SnapshotChanged()
    assert store.runs.get("r").status == "suspended"


def test_plain_claim_of_a_fresh_running_row_is_heartbeat_fresh(store):
    """RS-18."""
    activate_new(store, "r", A)
    assert store.runs.claim("r", running(A, 0), B, 0) == HeartbeatFresh()


def test_plain_claim_never_admits_a_running_row_even_stale(store, clock):
    """RS-19 (D4)."""
    activate_new(store, "r", A)
    clock.advance(31_000)
    assert store.runs.claim("r", running(A, 0), C, 31_000) == SnapshotChanged()
    row = store.runs.get("r")
    assert row.claimant is None and row.owner == A


def test_claim_of_missing_or_already_claimed_run(runs):
    """RS-20."""
    assert runs.claim("missing", PENDING, A, 0) == NotFound()
    runs.create("r", "{}")
    assert runs.claim("r", PENDING, A, 0) == Claimed(0)
    assert runs.claim("r", PENDING, B, 0) == AlreadyClaimed()


def test_recover_claim_sequence(store, clock):
    """RS-21."""
    runs = store.runs
    runs.create("r", "{}")
    runs.claim("r", PENDING, A, 0)
    assert runs.recover_claim("r", A, 0, B, 0, ev(A, B, 0)) == ClaimFresh()
    clock.advance(31_000)
    assert runs.claim("r", PENDING, B, 31_000) == AlreadyClaimed()
    assert runs.recover_claim("r", A, 0, B, 31_000, ev(C, B, 31_000)) == LivenessUnconfirmed()
    assert runs.recover_claim("r", A, 0, B, 31_000, ev(A, B, 31_000)) == Recovered()
    assert runs.recover_claim("r", A, 0, B, 31_000, ev(A, B, 31_000)) == ClaimChanged()
    assert runs.claim("r", PENDING, B, 31_000) == Claimed(31_000)
    assert runs.recover_claim("missing", A, 0, B, 31_000, ev(A, B, 31_000)) == NotFound()


def test_steal_sequence(store, clock):
    """RS-23."""
    activate_new(store, "r", A)
    runs = store.runs
    assert runs.steal("r", running(A, 0), C, 0, ev(A, C, 0)) == HeartbeatFresh()
    clock.advance(31_000)
    assert runs.claim("r", running(A, 0), C, 31_000) == SnapshotChanged()
    assert runs.steal("r", running(A, 0), C, 31_000, ev(B, C, 31_000)) == LivenessUnconfirmed()
    assert runs.steal("r", running(A, 0), C, 31_000, ev(A, C, 31_000)) == Claimed(31_000)


def test_steal_with_a_snapshot_older_than_a_heartbeat_is_snapshot_changed(store, clock):
    """RS-24."""
    activate_new(store, "r", A)
    clock.set(31_000)
    assert store.runs.heartbeat("r", A, 31_000) == Updated(31_000)
    clock.set(62_000)
    assert store.runs.steal("r", running(A, 0), C, 62_000, ev(A, C, 62_000)) == SnapshotChanged()


def test_abandoning_a_steal_leaves_the_old_owner(store, clock):
    """RS-26."""
    activate_new(store, "r", A)
    clock.set(31_000)
    assert store.runs.steal("r", running(A, 0), B, 31_000, ev(A, B, 31_000)) == Claimed(31_000)
    assert store.runs.abandon_claim("r", B, 31_000) == Abandoned()
    row = store.runs.get("r")
    assert (row.owner, row.heartbeat_at_ms, row.claimant) == (A, 0, None)


def test_activate_and_abandon_without_the_token_are_claim_lost(runs):
    """RS-27."""
    assert runs.activate("missing", A, 0, PENDING) == ClaimLost()
    assert runs.abandon_claim("missing", A, 0) == ClaimLost()
    runs.create("r", "{}")
    runs.claim("r", PENDING, A, 0)
    assert runs.activate("r", B, 0, PENDING) == ClaimLost()
    assert runs.abandon_claim("r", B, 0) == ClaimLost()


def test_an_old_token_of_the_same_claimant_loses_after_recover_and_reclaim(store, clock):
    """The claim token is (claimant, claimed_at_ms), not the claimant: A's claim from 0 is recovered,
    A claims again at 31 000, and the token from 0 no longer activates, abandons or recovers."""
    runs = store.runs
    runs.create("r", "{}")
    assert runs.claim("r", PENDING, A, 0) == Claimed(0)
    clock.set(31_000)
    assert runs.recover_claim("r", A, 0, B, 31_000, ev(A, B, 31_000)) == Recovered()
    assert runs.claim("r", PENDING, A, 31_000) == Claimed(31_000)
    clock.set(62_001)
    assert runs.recover_claim("r", A, 0, B, 62_001, ev(A, B, 62_001)) == ClaimChanged()
    assert runs.activate("r", A, 0, PENDING) == ClaimLost()
    assert runs.abandon_claim("r", A, 0) == ClaimLost()
    row = runs.get("r")
    assert (row.status, row.claimant, row.claimed_at_ms) == ("pending", A, 31_000)
    assert runs.activate("r", A, 31_000, PENDING) == Activated()


def test_old_owner_heartbeat_after_steal_and_activate_is_fence_lost(store, clock):
    """RS-28."""
    activate_new(store, "r", A)
    clock.set(31_000)
    assert store.runs.steal("r", running(A, 0), B, 31_000, ev(A, B, 31_000)) == Claimed(31_000)
    assert store.runs.activate("r", B, 31_000, running(A, 0)) == Activated()
    assert store.runs.heartbeat("r", A, 31_001) == FenceLost()


def test_heartbeat_and_transition_outcomes(store):
    """RS-29: omitted state keeps the old one."""
    runs = store.runs
    assert runs.heartbeat("missing", A, 0) == NotFound()
    assert runs.transition_owned("missing", A, "failed") == NotFound()
    activate_new(store, "r", A)
    assert runs.transition_owned("r", A, "running", '{"cursor":1}') == Transitioned()
    assert runs.transition_owned("r", A, "running") == Transitioned()
    assert runs.transition_owned("r", B, "failed") == FenceLost()
    assert runs.get("r").state_json == '{"cursor":1}'


@pytest.mark.parametrize("to,state", [("unknown", None), ("failed", "not-json")], ids=["bad-status", "bad-state"])
def test_invalid_transition_input_is_invalid_run(runs, to, state):
    """RS-30."""
    with pytest.raises(RunStoreError) as e:
        runs.transition_owned("nobody", A, to, state)
    assert e.value.code == "invalid_run"


def test_write_tolerance_boundary_against_real_steal_sql(store, clock):
    """RS-36: a stalled owner stays unstealable until strictly 30 s; skew lets a peer read 5 s ahead."""
    activate_new(store, "r", A)
    clock.set(18_999)
    assert store.runs.steal("r", running(A, 0), C, 18_999, ev(A, C, 18_999)) == HeartbeatFresh()
    assert store.runs.steal("r", running(A, 0), C, 23_999, ev(A, C, 23_999)) == HeartbeatFresh()
    clock.set(30_000)
    assert store.runs.steal("r", running(A, 0), C, 30_000, ev(A, C, 30_000)) == HeartbeatFresh()
    clock.set(30_001)
    assert store.runs.steal("r", running(A, 0), C, 30_001, ev(A, C, 30_001)) == Claimed(30_001)
    assert store.runs.get("r").claimant == C


def test_heartbeat_constants_are_related():
    """RS-37: skew > interval; tolerance < staleAfter; tolerance is derived."""
    assert SKEW_ALLOWANCE > HEARTBEAT_INTERVAL and WRITE_TOLERANCE < STALE_AFTER
    assert WRITE_TOLERANCE == STALE_AFTER - SKEW_ALLOWANCE - HEARTBEAT_INTERVAL


def test_owner_may_suspend_while_a_steal_is_pending(store, clock):
    """RS-38."""
    activate_new(store, "r", A)
    clock.set(31_000)
    store.runs.steal("r", running(A, 0), B, 31_000, ev(A, B, 31_000))
    assert store.runs.transition_owned("r", A, "suspended", '{"reason":"opaque"}') == Transitioned()
    row = store.runs.get("r")
    assert (row.status, row.owner, row.heartbeat_at_ms, row.claimant, row.claimed_at_ms, row.state_json) == (
        "suspended", None, None, None, None, '{"reason":"opaque"}')
    # The stealer's reservation went with it: the parked run is claimable again.
    assert store.runs.claim("r", row, C, 31_000) == Claimed(31_000)


@pytest.mark.parametrize("to", ["completed", "failed", "cancelled"])
def test_terminal_transition_stamps_finish_and_clears_ownership(store, to):
    """RS-39, RS-42."""
    activate_new(store, "r", A)
    assert store.runs.transition_owned("r", A, to) == Transitioned()
    row = store.runs.get("r")
    assert (row.status, row.finished_at_ms, row.owner, row.heartbeat_at_ms, row.claimant) == (to, 0, None, None, None)


def test_terminal_rows_are_never_claimed_or_stolen(store, clock):
    """RS-40, RS-41."""
    activate_new(store, "r", A)
    store.runs.transition_owned("r", A, "completed")
    assert store.runs.claim("r", store.runs.get("r"), B, 0) == SnapshotChanged()
    clock.advance(30_001)
    assert store.runs.steal("r", running(A, 0), B, 30_001, ev(A, B, 30_001)) == SnapshotChanged()
    row = store.runs.get("r")
    assert (row.status, row.owner, row.claimant) == ("completed", None, None)


@pytest.mark.parametrize("n,expect", [(29_999, False), (30_000, False), (30_001, True)],
                         ids=["29999", "30000", "30001"])
def test_staleness_cutoff_is_strict(store, clock, n, expect):
    """RS-43: claimAndOwn, recoverClaim and steal agree on the strict 30 s cutoff."""
    activate_new(store, "own", A)
    activate_new(store, "steal", A)
    store.runs.create("rec", "{}")
    store.runs.claim("rec", PENDING, A, 0)
    clock.set(n)
    r1 = store.runs.claim_and_own("own", running(A, 0), B, n, ev(A, B, n))
    r2 = store.runs.recover_claim("rec", A, 0, B, n, ev(A, B, n))
    r3 = store.runs.steal("steal", running(A, 0), B, n, ev(A, B, n))
    if expect:
        assert (r1, r2, r3) == (Activated(), Recovered(), Claimed(n))
    else:
        assert (r1, r2, r3) == (HeartbeatFresh(), ClaimFresh(), HeartbeatFresh())


@pytest.mark.parametrize("variant", ["checked-earlier", "checked-later", "cross-kind-same-host",
                                     "same-kind-cross-host"])
def test_mismatched_evidence_is_refused_everywhere(store, clock, variant):
    """RS-44; and (pitfall "evidence binds to one instant") evidence checked 1 ms after ``now_ms``
    is refused like evidence checked 1 ms before it."""
    activate_new(store, "own", A)
    activate_new(store, "steal", A)
    store.runs.create("rec", "{}")
    store.runs.claim("rec", PENDING, A, 0)
    n = 30_001
    clock.set(n)
    observer, e = {
        "checked-earlier": (B, ev(A, B, n - 1, "same-host-pid-dead")),
        "checked-later": (B, ev(A, B, n + 1, "same-host-pid-dead")),
        "cross-kind-same-host": (B, ev(A, B, n, "cross-host-unreachable-stale")),
        "same-kind-cross-host": (C, ev(A, C, n, "same-host-pid-dead")),
    }[variant]
    assert store.runs.claim_and_own("own", running(A, 0), observer, n, e) == EvidenceRequired()
    assert store.runs.recover_claim("rec", A, 0, observer, n, e) == LivenessUnconfirmed()
    assert store.runs.steal("steal", running(A, 0), observer, n, e) == LivenessUnconfirmed()


def test_skew_allowance_edges(store, clock):
    """RS-45: a reading exactly store+10 s is accepted; one more ms is invalid_run; behind is fine."""
    activate_new(store, "r1", A)
    activate_new(store, "r2", A)
    clock.set(30_001)
    assert store.runs.steal("r1", running(A, 0), C, 20_001, ev(A, C, 20_001)) == HeartbeatFresh()
    assert store.runs.steal("r1", running(A, 0), C, 40_001, ev(A, C, 40_001)) == Claimed(40_001)
    with pytest.raises(RunStoreError) as e:
        store.runs.steal("r2", running(A, 0), C, 40_002, ev(A, C, 40_002))
    assert e.value.code == "invalid_run"


def test_heartbeat_of_suspended_or_missing_run(store):
    """RS-47."""
    activate_new(store, "r", A)
    store.runs.transition_owned("r", A, "suspended")
    assert store.runs.heartbeat("r", A, 0) == FenceLost()
    assert store.runs.heartbeat("never", A, 0) == NotFound()


def test_whole_run_row_is_accepted_as_expected(store, clock):
    """RS-48."""
    runs = store.runs
    runs.create("a", "{}")
    assert runs.claim_and_own("a", runs.get("a"), A, 0) == Activated()
    runs.create("b", "{}")
    assert runs.claim("b", runs.get("b"), A, 1) == Claimed(1)
    assert runs.activate("b", A, 1, runs.get("b")) == Activated()
    clock.set(31_000)
    assert runs.steal("b", runs.get("b"), C, 31_000, ev(A, C, 31_000)) == Claimed(31_000)


@pytest.mark.parametrize("bad", [
    None, {"status": "pending", "owner": None, "heartbeat_at_ms": None}, ("pending", None, None),
    RunSnapshot("unknown", None, None), RunSnapshot("pending", None, -1), RunSnapshot("pending", A, None),
    RunSnapshot("running", None, 0), RunSnapshot("running", A, None), RunSnapshot(True, None, None),
], ids=["none", "dict", "tuple", "unknown-status", "negative-hb", "pending-with-owner", "running-no-owner",
        "running-no-hb", "bool-status"])
def test_malformed_snapshots_are_invalid_run_and_write_nothing(store, bad):
    """RS-49, BD-04 (Python analogue: only RunSnapshot/RunRow, complete and consistent)."""
    store.runs.create("r", "{}")
    with pytest.raises(RunStoreError) as e:
        store.runs.claim_and_own("r", bad, A, 0)
    assert e.value.code == "invalid_run"
    assert store.runs.get("r").status == "pending"


def test_takeover_after_owner_row_deleted_or_foreign_claim(store, clock):
    """BD-05: absent and claimed are named before evidence is demanded."""
    from .conftest import raw_exec

    activate_new(store, "gone", A)
    activate_new(store, "claimed", A)
    clock.set(31_000)
    raw_exec(store, "DELETE FROM flows_runs WHERE run_id = 'gone'")
    assert store.runs.claim_and_own("gone", running(A, 0), B, 31_000) == NotFound()
    raw_exec(store, "UPDATE flows_runs SET claim_host_id='host-x', claim_pid=1, claim_nonce='x', claimed_at_ms=5 "
                    "WHERE run_id = 'claimed'")
    assert store.runs.claim_and_own("claimed", running(A, 0), B, 31_000) == AlreadyClaimed()


def test_reconfirm_renews_only_while_no_claim_is_pending(store, clock):
    """Seed leases.md: reconfirm succeeds only when the owner matches and no claim is pending."""
    activate_new(store, "r", A)
    clock.set(25_000)
    assert store.runs.reconfirm("r", A, 25_000) == Updated(25_000)
    assert store.runs.reconfirm("r", B, 25_000) == FenceLost()
    assert store.runs.reconfirm("missing", A, 25_000) == NotFound()
    clock.set(55_001)
    assert store.runs.steal("r", running(A, 25_000), C, 55_001, ev(A, C, 55_001)) == Claimed(55_001)
    assert store.runs.heartbeat("r", A, 55_001) == Updated(55_001)  # a heartbeat still holds the fence
    assert store.runs.reconfirm("r", A, 55_002) == FenceLost()  # a reserved lease wins before activation


def test_heartbeat_is_monotonic(store):
    """Seed leases.md, LO-01 (newer line): a late pulse is Updated but never moves the stamp back (200 then
    150 leaves 200). LO-01's other two points follow the newer line too: a far-future stamp is bounded by
    the skew allowance (RS-45, ``test_skew_allowance_edges``), a bad stamp is ``invalid_run`` with
    ``{field, detail}`` (RX-06, ``test_every_timestamp_is_a_safe_integer_and_never_echoed``)."""
    activate_new(store, "r", A)
    assert store.runs.heartbeat("r", A, 200) == Updated(200)
    assert store.runs.heartbeat("r", A, 150) == Updated(200)
    assert store.runs.get("r").heartbeat_at_ms == 200


def test_the_run_row_heartbeat_never_moves_back_even_when_the_lease_is_behind_it(store, raw):
    """Heartbeats only move forward on the run row itself, not only in the lease: a row stamp ahead
    of the lease (written by another tool) is kept when a pulse renews the lease to an earlier one."""
    activate_new(store, "r", A)
    raw.exec_driver_sql("UPDATE flows_runs SET heartbeat_at_ms = 500 WHERE run_id = 'r'")
    raw.commit()
    assert store.runs.heartbeat("r", A, 200) == Updated(500)
    assert store.runs.get("r").heartbeat_at_ms == 500
    assert store.runs.heartbeat_many(A, ["r"], 300) == {"r": Updated(500)}
    assert store.runs.get("r").heartbeat_at_ms == 500


@pytest.mark.parametrize("end", ["completed", "failed", "cancelled"])
def test_claim_and_own_never_revives_a_terminal_run(store, end):
    """REFERENCE 2.2: claimAndOwn admits only pending, suspended and running rows."""
    activate_new(store, "r", A)
    store.runs.transition_owned("r", A, end)
    row = store.runs.get("r")
    assert store.runs.claim_and_own("r", row, B, 0) == SnapshotChanged()
    assert store.runs.claim("r", row, B, 0) == SnapshotChanged()
    after = store.runs.get("r")
    assert (after.status, after.owner, after.claimant) == (end, None, None)


def test_a_suspended_run_may_be_retaken_by_another_owner_at_once(store):
    """A carried question: should a run its owner suspended be closed to other workers for a while?
    No: the seeds' transition table says ``suspended`` clears owner, heartbeat and claim and leaves
    the run "parked and claimable again", and the claim predicate admits ``pending`` and
    ``suspended`` alike, with no staleness condition. Pinned at the very millisecond of the
    suspension, for both two-phase claim and claim_and_own."""
    for run_id, take in (("two-phase", "claim"), ("atomic", "claim_and_own")):
        activate_new(store, run_id, A, 5)
        assert store.runs.transition_owned(run_id, A, "suspended") == Transitioned()
        row = store.runs.get(run_id)
        assert (row.status, row.owner, row.heartbeat_at_ms, row.claimant) == ("suspended", None, None, None)
        snap = RunSnapshot("suspended", None, None)
        if take == "claim":
            claimed = store.runs.claim(run_id, snap, B, 5)
            assert claimed == Claimed(5)
            assert store.runs.activate(run_id, B, 5, snap) == Activated()
        else:
            assert store.runs.claim_and_own(run_id, snap, C, 5) == Activated()
        assert store.runs.get(run_id).status == "running"
        assert store.runs.get(run_id).owner == (B if take == "claim" else C)
        # The former owner is fenced out from then on.
        assert store.runs.heartbeat(run_id, A, 5) == FenceLost()
