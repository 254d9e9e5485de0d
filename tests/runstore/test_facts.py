"""Companion-stream consensus facts and their transaction (UPSTREAM-TESTS A2, REFERENCE 3.5)."""

from __future__ import annotations

import pytest

import fencepost
from fencepost import (
    Abandoned,
    Activated,
    AlreadyClaimed,
    Claimed,
    FenceLost,
    Recovered,
    RunStoreError,
    SnapshotChanged,
    Transitioned,
    Updated,
)
from fencepost.journal import companion_stream

from .conftest import PENDING, A, B, C, activate_new, count, ev, facts, revision, running


def test_two_phase_claim_records_claimed_activated_then_released(store):
    """OT-01: heartbeats record nothing; the run's own stream stays empty."""
    runs = store.runs
    runs.create("r", "{}")
    assert runs.claim("r", PENDING, A, 0) == Claimed(0)
    assert runs.activate("r", A, 0, PENDING) == Activated()
    assert runs.heartbeat("r", A, 0) == Updated(0)
    assert runs.transition_owned("r", A, "completed") == Transitioned()
    assert facts(store, "r") == [("claimed", A, 0), ("activated", A, 0), ("released", A, None)]


def test_re_own_of_own_stale_run_records_released_claimed_activated(store, clock):
    """REFERENCE 3.5: re-own of the caller's own stale run under a fresh grant."""
    activate_new(store, "r", A)
    clock.set(30_001)
    assert store.runs.claim_and_own("r", running(A, 0), A, 30_001) == Activated()
    assert facts(store, "r")[2:] == [("released", A, None), ("claimed", A, 30_001), ("activated", A, 30_001)]


def test_steal_and_evidence_takeover_facts(store, clock):
    """OT-03."""
    activate_new(store, "run-steal", A)
    activate_new(store, "run-take", A)
    clock.set(30_001)
    assert store.runs.steal("run-steal", running(A, 0), C, 30_001, ev(A, C, 30_001)) == Claimed(30_001)
    assert store.runs.claim_and_own("run-take", running(A, 0), C, 30_001, ev(A, C, 30_001)) == Activated()
    assert facts(store, "run-steal")[2:] == [("stolen", C, 30_001)]
    assert facts(store, "run-take")[2:] == [("stolen", C, 30_001), ("activated", C, 30_001)]


@pytest.mark.parametrize("path", ["abandon", "activate-after-move", "recover"])
def test_claim_release_paths_record_their_fact(store, clock, path):
    """OT-04."""
    runs = store.runs
    runs.create("r", "{}")
    runs.claim("r", PENDING, A, 0)
    if path == "abandon":
        assert runs.abandon_claim("r", A, 0) == Abandoned()
        expected = [("claimed", A, 0), ("released", A, 0)]
    elif path == "activate-after-move":
        assert runs.activate("r", A, 0, fencepost.RunSnapshot("suspended", None, None)) == SnapshotChanged()
        expected = [("claimed", A, 0), ("released", A, 0)]
        assert runs.get("r").claimant is None
        assert runs.claim("r", PENDING, B, 0) == Claimed(0)  # the lease was released too
        expected.append(("claimed", B, 0))
    else:
        clock.set(30_001)
        assert runs.recover_claim("r", A, 0, C, 30_001, ev(A, C, 30_001)) == Recovered()
        expected = [("claimed", A, 0), ("expired", A, 0)]
    assert facts(store, "r") == expected


def test_refused_claims_and_heartbeats_record_nothing(store):
    """OT-05."""
    store.runs.create("r", "{}")
    store.runs.claim("r", PENDING, A, 0)
    assert store.runs.claim("r", PENDING, B, 0) == AlreadyClaimed()
    assert store.runs.heartbeat("r", B, 0) == FenceLost()
    assert facts(store, "r") == [("claimed", A, 0)]


class _Boom(Exception):
    pass


def test_rolled_back_transition_leaves_neither_row_change_nor_fact_nor_lease_change(store):
    """OT-06, OC-05: the outer transaction fails after the fact was written."""
    activate_new(store, "r", A)
    before = revision(store)

    def body(conn):
        assert store.runs.transition_owned("r", A, "suspended") == Transitioned()
        assert [f[0] for f in facts_in(conn)] == ["claimed", "activated", "released"]
        raise _Boom()

    def facts_in(conn):
        rows = conn.exec_driver_sql("SELECT event_type FROM flows_journal_events ORDER BY position").fetchall()
        return [(r[0].removeprefix("flows.consensus."),) for r in rows]

    with pytest.raises(_Boom):
        store.db.write(body)
    assert [f[0] for f in facts(store, "r")] == ["claimed", "activated"]
    row = store.runs.get("r")
    assert (row.status, row.owner) == ("running", A)
    assert revision(store) == before
    assert store.runs.heartbeat("r", A, 1) == Updated(1)  # the lease rolled back with the row


def test_committed_claim_always_has_its_fact_and_lease(store):
    """Facts and rows agree after a commit inside an outer write."""
    store.runs.create("r", "{}")
    store.db.write(lambda conn: store.runs.claim_and_own("r", PENDING, A, 0))
    assert [f[0] for f in facts(store, "r")] == ["claimed", "activated"]
    assert store.runs.get("r").owner == A


def test_companion_prefixed_run_id_is_refused(runs):
    """OT-08."""
    with pytest.raises(RunStoreError) as e:
        runs.create(companion_stream("run-x"), "{}")
    assert e.value.code == "invalid_run" and e.value.cause == {"field": "runId"}


def test_no_fact_reaches_the_runs_own_stream(store):
    """REFERENCE 3.5: the run's own stream is never written by the store."""
    activate_new(store, "r", A)
    store.runs.transition_owned("r", A, "completed")
    with store.db.connect() as conn:
        own = conn.exec_driver_sql("SELECT count(*) FROM flows_journal_events WHERE run_id = 'r'").scalar()
    assert own == 0 and count(store, "flows_journal_events") == 3
