"""One parametrized test per row of every outcome table in the seeds (ids are the seeds' row keys)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fencepost import (
    AlreadyClaimed,
    AlreadyRequested,
    Attempt,
    AttemptStore,
    AttemptStoreError,
    CancelRequested,
    ClaimLost,
    EvidenceRequired,
    FenceLost,
    GuardFailed,
    HeartbeatFresh,
    NotFound,
    RunStore,
    RunStoreError,
    SnapshotChanged,
    Terminal,
)
from fencepost.runstore import heartbeat

from .conftest import PENDING, A, B, activate_new, fresh, running
from .test_metrics import Delta, key, spans

# --------------------------------------------------------------- claim-and-finish: "The outcomes you have to handle"


def _not_found(s):
    return s.runs.claim(fresh("absent"), PENDING, A, s.clock.now_ms())


def _already_claimed(s):
    r = fresh()
    s.runs.create(r, "{}")
    s.runs.claim(r, PENDING, A, s.clock.now_ms())
    return s.runs.claim(r, PENDING, B, s.clock.now_ms())


def _heartbeat_fresh(s):
    r = fresh()
    activate_new(s, r, A)
    return s.runs.claim_and_own(r, s.runs.get(r), B, s.clock.now_ms())


def _snapshot_changed(s):
    r = fresh()
    activate_new(s, r, A)
    s.runs.transition_owned(r, A, "suspended")  # the row moved after the caller read it pending
    return s.runs.claim(r, PENDING, B, s.clock.now_ms())


def _evidence_required(s):
    r, t = fresh(), s.clock.now_ms()
    activate_new(s, r, A)
    s.clock.set(t + 30_001)
    return s.runs.claim_and_own(r, running(A, t), B, t + 30_001)


def _claim_lost(s):
    r = fresh()
    s.runs.create(r, "{}")
    return s.runs.activate(r, A, 0, PENDING)


def _fence_lost(s):
    r = fresh()
    activate_new(s, r, A)
    return s.runs.heartbeat(r, B, s.clock.now_ms())


def _guard_failed(s):
    r = fresh()
    activate_new(s, r, A)
    s.runs.request_cancel(r, 1)
    return s.runs.transition_owned(r, A, "completed", guard={"cancel_requested": "absent"})


CLAIM_TABLE = [
    ("NotFound", _not_found, NotFound()), ("AlreadyClaimed", _already_claimed, AlreadyClaimed()),
    ("HeartbeatFresh", _heartbeat_fresh, HeartbeatFresh()), ("SnapshotChanged", _snapshot_changed, SnapshotChanged()),
    ("EvidenceRequired", _evidence_required, EvidenceRequired()), ("ClaimLost", _claim_lost, ClaimLost()),
    ("FenceLost", _fence_lost, FenceLost()), ("GuardFailed", _guard_failed, GuardFailed()),
]


@pytest.mark.parametrize("make,expected", [(m, e) for _, m, e in CLAIM_TABLE], ids=[t for t, _, _ in CLAIM_TABLE])
def test_claim_and_finish_outcome_table_row(mstore, make, expected):
    """Seed claim-and-finish-a-run.md, "The outcomes you have to handle": each row, as a returned value."""
    assert make(mstore) == expected


# --------------------------------------------------------------- cancel-a-run: request outcomes


def _cancel_requested(s):
    r = fresh()
    s.runs.create(r, "{}")
    return s.runs.request_cancel(r, 77), CancelRequested(77)


def _already_requested(s):
    r = fresh()
    s.runs.create(r, "{}")
    s.runs.request_cancel(r, 5)
    return s.runs.request_cancel(r, 9), AlreadyRequested(5)


def _terminal(s):
    r = fresh()
    activate_new(s, r, A)
    s.runs.transition_owned(r, A, "failed")
    return s.runs.request_cancel(r, 9), Terminal("failed")


def _cancel_not_found(s):
    return s.runs.request_cancel(fresh("absent"), 9), NotFound()


CANCEL_TABLE = [("CancelRequested", _cancel_requested), ("AlreadyRequested", _already_requested),
                ("Terminal", _terminal), ("NotFound", _cancel_not_found)]


@pytest.mark.parametrize("make", [m for _, m in CANCEL_TABLE], ids=[t for t, _ in CANCEL_TABLE])
def test_cancel_outcome_table_row(mstore, make):
    """Seed cancel-a-run.md request outcome table."""
    got, expected = make(mstore)
    assert got == expected


# --------------------------------------------------------------- leases: the four durations

DURATIONS = [("heartbeatInterval", heartbeat.HEARTBEAT_INTERVAL, 1), ("heartbeatStaleAfter", heartbeat.STALE_AFTER, 30),
             ("heartbeatSkewAllowance", heartbeat.SKEW_ALLOWANCE, 10),
             ("heartbeatWriteTolerance", heartbeat.WRITE_TOLERANCE, 19)]


@pytest.mark.parametrize("value,seconds", [(v, s) for _, v, s in DURATIONS], ids=[n for n, _, _ in DURATIONS])
def test_lease_duration_table_row(value, seconds):
    """Seed leases.md, "The four durations"."""
    assert isinstance(value, timedelta) and value == timedelta(seconds=seconds)


# --------------------------------------------------------------- durable-values: the shape limits

LIMITS = [("RunStore.maximumRunJsonDepth", RunStore.MAXIMUM_RUN_JSON_DEPTH, 128),
          ("RunStore.maximumRunJsonNodes", RunStore.MAXIMUM_RUN_JSON_NODES, 100_000),
          ("AttemptStore.maximumJsonDepth", AttemptStore.MAXIMUM_JSON_DEPTH, 128),
          ("AttemptStore.maximumJsonNodes", AttemptStore.MAXIMUM_JSON_NODES, 100_000)]


@pytest.mark.parametrize("value,expected", [(v, e) for _, v, e in LIMITS], ids=[n for n, _, _ in LIMITS])
def test_durable_value_limit_table_row(mstore, value, expected):
    """Seed durable-values.md limits table; the depth limit is enforced exactly at its value."""
    assert value == expected
    if expected == 128:
        mstore.runs.create(fresh(), "[" * 128 + "]" * 128)
        with pytest.raises(RunStoreError):
            mstore.runs.create(fresh(), "[" * 129 + "]" * 129)


# --------------------------------------------------------------- compose-the-stores: the stubs


def test_noop_table_row_run_store():
    """``RunStore.layerNoop()``: create/get fail persistence_failed; CAS report their loss."""
    noop = RunStore.noop()
    for call in (lambda: noop.create("r", "{}"), lambda: noop.get("r")):
        with pytest.raises(RunStoreError) as e:
            call()
        assert e.value.code == "persistence_failed"
    assert noop.claim("r", PENDING, A, 0) == NotFound()
    assert (noop.activate("r", A, 0, PENDING), noop.abandon_claim("r", A, 0)) == (ClaimLost(), ClaimLost())


def test_noop_table_row_attempt_store():
    """``AttemptStore.layerNoop()``: every operation fails with ``unknown``."""
    noop = AttemptStore.noop()
    for call in (lambda: noop.put(Attempt("r", "d", 0, "running", 0), A), lambda: noop.get("r", "d", 0)):
        with pytest.raises(AttemptStoreError) as e:
            call()
        assert e.value.code == "unknown"


# --------------------------------------------------------------- observe-outcomes: the three counters

COUNTERS = [("flows_run_claims", {"op": "claim", "outcome": "not_found"}, _not_found),
            ("flows_run_heartbeats", {"outcome": "fence_lost"}, _fence_lost),
            ("flows_run_transitions", {"outcome": "guard_failed", "to": "completed"}, _guard_failed)]


@pytest.mark.parametrize("name,attrs,make", COUNTERS, ids=[c[0] for c in COUNTERS])
def test_counter_table_row(otel, mstore, name, attrs, make):
    """Seed observe-outcomes.md counter table: name and attributes exactly."""
    d = Delta(otel, [key(name, **attrs)])
    make(mstore)
    assert list(d().values()) == [1]


# --------------------------------------------------------------- observe-outcomes: the span table


def _span_rows():
    def seeded(s, *, own=False, claim=False):
        r = fresh()
        if own:
            activate_new(s, r, A)
        else:
            s.runs.create(r, "{}")
            if claim:
                s.runs.claim(r, PENDING, A, s.clock.now_ms())
        return r

    def now(s):
        return s.clock.now_ms()

    ident = lambda r: {"runId": r}  # noqa: E731
    return [
        ("RunStore.create", lambda s: (r := fresh(), s.runs.create(r, "{}"), (ident(r), "success"))[-1]),
        ("RunStore.get", lambda s: (r := seeded(s), s.runs.get(r), (ident(r), "success"))[-1]),
        ("RunStore.lineage", lambda s: (r := seeded(s), s.runs.lineage(r), (ident(r), "success"))[-1]),
        ("RunStore.latestRound", lambda s: (r := seeded(s), s.runs.latest_round(r), (ident(r), "success"))[-1]),
        ("RunStore.requestCancel", lambda s: (r := seeded(s), s.runs.request_cancel(r, 1),
                                              (ident(r), "cancel_requested"))[-1]),
        ("RunStore.requestCancelLineage", lambda s: (r := seeded(s), s.runs.request_cancel_lineage(r, 1),
                                                     (ident(r), "cancel_requested"))[-1]),
        ("RunStore.acknowledgeCancel", lambda s: (r := seeded(s, own=True), s.runs.acknowledge_cancel(r, A, 1),
                                                  ({**ident(r), "ownerHostId": "host-a"}, "success"))[-1]),
        ("RunStore.claim", lambda s: (r := seeded(s), s.runs.claim(r, PENDING, A, now(s)),
                                      ({**ident(r), "claimantHostId": "host-a"}, "claimed"))[-1]),
        ("RunStore.claimAndOwn", lambda s: (r := seeded(s), s.runs.claim_and_own(r, PENDING, A, now(s)),
                                            ({**ident(r), "ownerHostId": "host-a"}, "activated"))[-1]),
        ("RunStore.activate", lambda s: (r := seeded(s, claim=True), s.runs.activate(r, A, now(s), PENDING),
                                         ({**ident(r), "claimantHostId": "host-a"}, "activated"))[-1]),
        ("RunStore.abandonClaim", lambda s: (r := seeded(s, claim=True), s.runs.abandon_claim(r, A, now(s)),
                                             ({**ident(r), "claimantHostId": "host-a"}, "abandoned"))[-1]),
        ("RunStore.recoverClaim", lambda s: (r := seeded(s, claim=True),
                                             s.runs.recover_claim(r, A, now(s), B, now(s), _ev(A, B, now(s))),
                                             ({**ident(r), "observerHostId": "host-a"}, "claim_fresh"))[-1]),
        ("RunStore.heartbeat", lambda s: (r := seeded(s, own=True), s.runs.heartbeat(r, A, now(s)),
                                          ({**ident(r), "ownerHostId": "host-a"}, "updated"))[-1]),
        ("RunStore.transitionOwned", lambda s: (r := seeded(s, own=True), s.runs.transition_owned(r, A, "completed"),
                                                ({**ident(r), "to": "completed", "ownerHostId": "host-a"},
                                                 "transitioned"))[-1]),
        ("RunStore.steal", lambda s: (r := seeded(s, own=True),
                                      s.runs.steal(r, s.runs.get(r), B, now(s), _ev(A, B, now(s))),
                                      ({**ident(r), "claimantHostId": "host-a"}, "heartbeat_fresh"))[-1]),
    ]


def _ev(o, c, n):
    from .conftest import ev

    return ev(o, c, n)


SPAN_ROWS = _span_rows()


@pytest.mark.parametrize("name,make", SPAN_ROWS, ids=[n for n, _ in SPAN_ROWS])
def test_span_table_row(otel, mstore, name, make):
    """Seed observe-outcomes.md span table: identity, acting host and ``outcome`` on success."""
    otel["exporter"].clear()
    attrs, outcome = make(mstore)
    got = spans(otel, name)[-1]
    assert dict(got.attributes) == {**attrs, "outcome": outcome}
