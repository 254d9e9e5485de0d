"""Counters and spans through the OpenTelemetry API, read with the SDK's in-memory readers (A11, DW-05/06)."""

from __future__ import annotations

import typing

import pytest

from fencepost import Activated, Attempt, AttemptStoreError, Claimed, FenceLost, RunStoreError, Transitioned
from fencepost.runstore import outcomes as o

from .conftest import PENDING, A, B, C, ev, fresh, running


def value(otel, name, **attrs):
    data = otel["reader"].get_metrics_data()
    total = 0
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for dp in m.data.data_points:
                        if dict(dp.attributes) == attrs:
                            total += dp.value
    return total


class Delta:
    def __init__(self, otel, series):
        self.otel, self.series = otel, series
        self.before = {k: value(otel, *k[:1], **dict(k[1:])) for k in series}

    def __call__(self):
        return {k: value(self.otel, *k[:1], **dict(k[1:])) - self.before[k] for k in self.series}


def key(name, **attrs):
    return (name, *sorted(attrs.items()))


def spans(otel, name):
    return [s for s in otel["exporter"].get_finished_spans() if s.name == name]


def test_outcome_vocabularies_in_order():
    """MT-01: each op's union lists the seed's tags in order; labels are snake case."""
    names = lambda alias: [c.__name__ for c in typing.get_args(alias)]  # noqa: E731
    assert names(o.ClaimOutcome) == ["Claimed", "NotFound", "AlreadyClaimed", "HeartbeatFresh", "SnapshotChanged"]
    assert names(o.ClaimAndOwnOutcome) == ["Activated", "NotFound", "AlreadyClaimed", "HeartbeatFresh",
                                           "SnapshotChanged", "EvidenceRequired"]
    assert names(o.ActivateOutcome) == ["Activated", "ClaimLost", "SnapshotChanged"]
    assert names(o.RecoverClaimOutcome) == ["Recovered", "NotFound", "ClaimFresh", "ClaimChanged",
                                            "LivenessUnconfirmed"]
    assert names(o.AbandonClaimOutcome) == ["Abandoned", "ClaimLost"]
    assert names(o.StealOutcome) == [*names(o.ClaimOutcome), "LivenessUnconfirmed"]
    assert names(o.HeartbeatOutcome) == ["Updated", "FenceLost", "NotFound"]
    assert names(o.TransitionOutcome) == ["Transitioned", "FenceLost", "NotFound", "GuardFailed"]
    assert o.snake_tag(o.HeartbeatFresh) == "heartbeat_fresh" and o.snake_tag(o.EvidenceRequired()) == \
        "evidence_required"


def test_claim_heartbeat_and_transition_counters(otel, mstore):
    """MT-02 (throughput included)."""
    r = fresh()
    d = Delta(otel, [key("flows_run_claims", op="claim", outcome="claimed"),
                     key("flows_run_claims", op="claim", outcome="already_claimed"),
                     key("flows_run_claims", op="activate", outcome="activated"),
                     key("flows_run_heartbeats", outcome="updated"), key("flows_run_heartbeats", outcome="fence_lost"),
                     key("flows_run_transitions", outcome="transitioned", to="completed"),
                     key("flows_run_transitions", outcome="fence_lost", to="completed"),
                     key("flows_run_throughput")])
    runs, t = mstore.runs, mstore.clock.now_ms()
    runs.create(r, "{}")
    runs.claim(r, PENDING, A, t)
    runs.claim(r, PENDING, B, t)
    runs.activate(r, A, t, PENDING)
    runs.heartbeat(r, A, t)
    runs.heartbeat(r, B, t)
    runs.transition_owned(r, A, "completed")
    runs.transition_owned(r, A, "completed")
    assert list(d().values()) == [1, 1, 1, 1, 1, 1, 1, 1]


def test_failures_are_counted(otel, mstore):
    """MT-03."""
    d = Delta(otel, [key("flows_run_claims", op="claim", outcome="failure"),
                     key("flows_run_heartbeats", outcome="failure"),
                     key("flows_run_transitions", outcome="failure", to="completed")])
    for call in (lambda: mstore.runs.claim("r", PENDING, A, -1), lambda: mstore.runs.heartbeat("r", A, -1),
                 lambda: mstore.runs.transition_owned("", A, "completed")):
        with pytest.raises(RunStoreError):
            call()
    assert list(d().values()) == [1, 1, 1]


def test_takeover_counts_one_steal_claimed_and_one_fence_lost(otel, mstore):
    """Seed observe-outcomes.md: a takeover test pins both halves of the exchange."""
    r, clock = fresh(), mstore.clock
    t = clock.now_ms()
    mstore.runs.create(r, "{}")
    mstore.runs.claim_and_own(r, PENDING, A, t)
    d = Delta(otel, [key("flows_run_claims", op="steal", outcome="claimed"),
                     key("flows_run_heartbeats", outcome="fence_lost"),
                     key("flows_run_claims", op="steal", outcome="liveness_unconfirmed")])
    clock.set(t + 30_001)
    n = t + 30_001
    assert mstore.runs.steal(r, running(A, t), C, n, ev(A, C, n)) == Claimed(n)
    assert mstore.runs.activate(r, C, n, running(A, t)) == Activated()
    assert mstore.runs.heartbeat(r, A, n) == FenceLost()
    assert list(d().values()) == [1, 1, 0]


def test_evidence_refusal_and_claim_cycle_counters(otel, mstore):
    """MT-04, MT-05."""
    r, s, clock = fresh(), fresh(), mstore.clock
    t = clock.now_ms()
    d = Delta(otel, [key("flows_run_claims", op="claim_and_own", outcome="activated"),
                     key("flows_run_claims", op="steal", outcome="liveness_unconfirmed"),
                     key("flows_run_claims", op="abandon_claim", outcome="abandoned"),
                     key("flows_run_claims", op="recover_claim", outcome="recovered")])
    mstore.runs.create(r, "{}")
    mstore.runs.claim_and_own(r, PENDING, A, t)
    mstore.runs.steal(r, running(A, t), C, t, ev(B, C, t))
    mstore.runs.create(s, "{}")
    mstore.runs.claim(s, PENDING, A, t)
    mstore.runs.abandon_claim(s, A, t)
    mstore.runs.claim(s, PENDING, A, t)
    clock.set(t + 31_000)
    mstore.runs.recover_claim(s, A, t, C, t + 31_000, ev(A, C, t + 31_000))
    assert list(d().values()) == [1, 1, 1, 1]


def test_spans_carry_identity_acting_host_and_outcome(otel, mstore):
    """SP-01, SP-02, SP-04, SP-06."""
    otel["exporter"].clear()
    r = fresh()
    runs = mstore.runs
    runs.create(r, "{}")
    runs.get(r)
    runs.request_cancel(r, 1)
    with pytest.raises(RunStoreError):
        runs.get(fresh())
    runs.claim_and_own(r, PENDING, A, mstore.clock.now_ms())
    with pytest.raises(RunStoreError):
        runs.transition_owned(r, A, "completed", "not-json")
    runs.acknowledge_cancel(r, A, 2)
    runs.acknowledge_cancel(r, B, 2)
    with pytest.raises(RunStoreError):
        runs.acknowledge_cancel(r, A, -1)
    create, = spans(otel, "RunStore.create")
    assert dict(create.attributes) == {"runId": r, "outcome": "success"}
    gets = spans(otel, "RunStore.get")
    assert [g.attributes["outcome"] for g in gets] == ["success", "failure"]
    assert spans(otel, "RunStore.requestCancel")[0].attributes["outcome"] == "cancel_requested"
    cao, = spans(otel, "RunStore.claimAndOwn")
    assert dict(cao.attributes) == {"runId": r, "ownerHostId": "host-a", "outcome": "activated"}
    tr, = spans(otel, "RunStore.transitionOwned")
    assert dict(tr.attributes) == {"outcome": "failure"}  # rejected before identity is recorded
    acks = spans(otel, "RunStore.acknowledgeCancel")
    assert [dict(a.attributes) for a in acks] == [
        {"runId": r, "ownerHostId": "host-a", "outcome": "success"},
        {"runId": r, "ownerHostId": "host-a", "outcome": "success"},
        {"outcome": "failure"}]


def test_attempt_spans(otel, mstore):
    """SP-05."""
    otel["exporter"].clear()
    r = fresh()
    mstore.runs.create(r, "{}")
    mstore.runs.claim_and_own(r, PENDING, A, mstore.clock.now_ms())
    a = Attempt(r, "d", 0, "running", 1)
    mstore.attempts.put(a, A)
    mstore.attempts.heartbeat(r, "d", 0, A, 2)
    mstore.attempts.patch(r, "d", 0, A, meta={"m": 1})
    mstore.attempts.get(r, "d", 0)
    with pytest.raises(AttemptStoreError):
        mstore.attempts.finish(Attempt(r, "d", 0, "running", 1, finished_at_ms=3), A)
    mstore.attempts.finish(Attempt(r, "d", 0, "done", 1, finished_at_ms=3), A)
    ident = {"runId": r, "stepKeyDigest": "d", "attempt": 0}
    for name, outcomes in [("put", ["inserted"]), ("heartbeat", ["updated"]), ("patch", ["patched"]),
                           ("finish", ["failure", "finished"])]:
        got = spans(otel, f"AttemptStore.{name}")
        assert [s.attributes["outcome"] for s in got] == outcomes
        assert dict(got[-1].attributes) == {**ident, "ownerHostId": "host-a", "outcome": outcomes[-1]}
    get, = spans(otel, "AttemptStore.get")
    assert dict(get.attributes) == {**ident, "outcome": "success"}


def test_throughput_counts_only_after_the_outermost_commit(otel, mstore):
    """DW-05: a terminal transition inside an outer write that fails counts nothing."""
    r = fresh()
    mstore.runs.create(r, "{}")
    mstore.runs.claim_and_own(r, PENDING, A, mstore.clock.now_ms())
    d = Delta(otel, [key("flows_run_throughput")])

    class Boom(Exception):
        pass

    def body(conn):
        assert mstore.runs.transition_owned(r, A, "completed") == Transitioned()
        raise Boom

    with pytest.raises(Boom):
        mstore.db.write(body)
    assert list(d().values()) == [0]
    assert mstore.runs.transition_owned(r, A, "completed") == Transitioned()
    assert list(d().values()) == [1]


class _Interrupted(__import__("fencepost.journal.consensus", fromlist=["SqlConsensus"]).SqlConsensus):
    def claim(self, conn, run_id, claimant, now_ms):
        raise KeyboardInterrupt


def test_interrupted_call_is_counted_and_closes_its_span_as_interrupt(otel, db_url, clock):
    """SP-03 analogue: an interruption inside the write closes the span with outcome ``interrupt``."""
    import fencepost

    otel["exporter"].clear()
    d = Delta(otel, [key("flows_run_claims", op="claim", outcome="interrupt")])
    with fencepost.open(db_url, clock=clock, consensus=_Interrupted()) as store:
        store.runs.create("r", "{}")
        with pytest.raises(KeyboardInterrupt):
            store.runs.claim("r", PENDING, A, 0)
        assert store.runs.get("r").claimant is None
    assert list(d().values()) == [1]
    assert spans(otel, "RunStore.claim")[-1].attributes["outcome"] == "interrupt"
