"""Issue 11: the run store's consensus facts carry what the store checked, and readers agree.

Each test drives the real run store (both backends) through a history the store admits and
checks what an auditor sees: the stored facts, ``ownership_history`` and the ``OwnershipHistory``
projection.
"""

from __future__ import annotations

from sqlalchemy import text

import fencepost
from fencepost import LivenessEvidence, OwnerId, RunSnapshot
from fencepost.journal import companion_stream, ownership_history
from fencepost.journal.redaction import DEFAULT, REDACTED_API_KEY
from fencepost.projections import OwnershipHistory, ProjectionBuilder
from fencepost.runstore.outcomes import Abandoned, Activated, Claimed, Transitioned, Updated

A = OwnerId("host-a", 101, "owner-a")
B = OwnerId("host-b", 202, "owner-b")
C = OwnerId("host-c", 303, "owner-c")
PENDING = RunSnapshot("pending", None, None)


def facts(store: fencepost.Store, run_id: str) -> list[tuple[str, dict]]:
    page = store.journal.entries(companion_stream(run_id))
    return [(e.event_type.rsplit(".", 1)[1], e.payload) for e in page.entries]


def projected(store: fencepost.Store, run_id: str) -> list[tuple]:
    with ProjectionBuilder(store, store.db, OwnershipHistory()) as builder:
        builder.catch_up()
        rows = builder.target.read(lambda conn: conn.execute(text(
            "SELECT owner_host_id, owner_pid, owner_nonce, granted_at_ms, activated_position, activated_at_ms, "
            "closed_position, closed_at_ms, closed_by FROM projection_ownership_history "
            "WHERE run_id = :r AND activated_position IS NOT NULL ORDER BY activated_position"),
            {"r": run_id}).all())
    return [(OwnerId(r[0], int(r[1]), r[2]), *r[3:]) for r in rows]


def replayed(history) -> list[tuple]:
    return [(i.owner, i.granted_at_ms, i.start_position, i.started_at_ms, i.end_position, i.ended_at_ms,
             i.ended_by) for i in history.intervals]


def own(store: fencepost.Store, run_id: str, owner: OwnerId, now: int) -> None:
    store.runs.create(run_id, "{}")
    claimed = store.runs.claim(run_id, PENDING, owner, now)
    assert isinstance(claimed, Claimed)
    assert isinstance(store.runs.activate(run_id, owner, claimed.claimed_at_ms, PENDING), Activated)


# ---------------------------------------------------------------------------- 1. redaction
def test_identifiers_shaped_like_credentials_survive_in_the_stores_own_facts(store: fencepost.Store) -> None:
    """Issue 11 (1): run id ``sk-learn-train-001`` and an owner whose host id and nonce look like
    keys are stored verbatim in payload and meta; replay and the projection see them."""
    keyish = OwnerId("sk-proj-host0000000000000001", 7, "ghp_" + "N" * 36)
    own(store, "sk-learn-train-001", keyish, store.clock.now_ms())
    entries = store.journal.entries(companion_stream("sk-learn-train-001")).entries
    assert [e.event_type for e in entries] == ["flows.consensus.claimed", "flows.consensus.activated"]
    for e in entries:
        assert e.payload["runId"] == "sk-learn-train-001" and e.meta == {"runId": "sk-learn-train-001"}
        assert e.payload["owner"] == keyish.to_json()
    history = ownership_history(store, "sk-learn-train-001")
    assert history.ok and [i.owner for i in history.intervals] == [keyish]
    assert projected(store, "sk-learn-train-001") == replayed(history)


def test_fact_redaction_keeps_structure_and_still_redacts_free_text() -> None:
    """Only the structural members keep their value, and only in their structural shape."""
    payload = {"runId": "sk-learn-train-001", "owner": {"hostId": "sk-host-000000000001", "pid": 1, "nonce": "n"},
               "grantedAtMs": 5, "note": "sk-live-0123456789abcdefghij",
               "cause": {"nested": "sk-x0123456789abcdefghij"}}
    out = DEFAULT.fact(payload)
    assert out["runId"] == "sk-learn-train-001" and out["owner"] == payload["owner"] and out["grantedAtMs"] == 5
    assert out["note"] == REDACTED_API_KEY and out["cause"] == {"nested": REDACTED_API_KEY}
    # The same value through the ordinary path is redacted everywhere.
    assert DEFAULT(payload)["runId"] == REDACTED_API_KEY


def test_a_fact_that_is_not_durable_is_refused_without_a_second_walk() -> None:
    """The fact redactor checks durability itself (the append path does not walk its output again):
    a NUL in a structural member, a non-finite number or a non-JSON value elsewhere is refused."""
    import math

    import pytest

    from fencepost.errors import JournalError
    from fencepost.journal._append import prepare

    ok = {"runId": "r", "owner": A.to_json(), "grantedAtMs": 1}
    assert prepare(ok, "payload", DEFAULT.fact) == '{"grantedAtMs":1,"owner":{"hostId":"host-a","nonce":"owner-a",' \
        '"pid":101},"runId":"r"}'
    for bad in ({**ok, "runId": "r\x00"}, {**ok, "owner": {"hostId": "h\x00", "pid": 1, "nonce": "n"}},
                {**ok, "cutoffMs": math.inf}, {**ok, "cause": {"x": {1, 2}}}, [math.nan]):
        with pytest.raises(JournalError) as caught:
            prepare(bad, "payload", DEFAULT.fact)
        assert caught.value.code == "invalid_event" and "payload" in str(caught.value)


def test_a_public_append_that_imitates_a_fact_is_redacted_as_usual(store: fencepost.Store) -> None:
    """The structural exception is the run store's own facts only, never a caller's entry."""
    store.journal.append_unfenced("elsewhere", "flows.consensus.claimed",
                                  {"runId": "sk-learn-train-001", "owner": A.to_json(), "grantedAtMs": 0},
                                  source_id="flows.run-store")
    (entry,) = store.journal.entries("elsewhere").entries
    assert entry.payload["runId"] == REDACTED_API_KEY


# ---------------------------------------------------------------------------- 2. facts and evidence
def test_a_stealers_claim_dropped_when_the_owner_suspends_leaves_a_fact(store: fencepost.Store) -> None:
    """Issue 11 (2a): B steals A's stale run (a claim only), A suspends, C claims: no violation."""
    t0 = store.clock.now_ms()
    own(store, "r", A, t0)
    store.clock.advance(31_000)
    now = store.clock.now_ms()
    running = store.runs.get("r").snapshot()
    assert isinstance(store.runs.steal("r", running, B, now, LivenessEvidence(A, now, "lease-expired")), Claimed)
    assert isinstance(store.runs.transition_owned("r", A, "suspended"), Transitioned)
    assert isinstance(store.runs.claim("r", RunSnapshot("suspended", None, None), C, now), Claimed)
    kinds = facts(store, "r")
    assert [k for k, _ in kinds] == ["claimed", "activated", "stolen", "released", "released", "claimed"]
    assert kinds[4][1]["owner"] == B.to_json() and kinds[4][1]["cause"] == "owner-left"
    assert kinds[4][1]["grantedAtMs"] == now
    history = ownership_history(store, "r")
    assert history.ok, history.violations
    assert [(i.owner, i.ended_by) for i in history.intervals] == [(A, "released")]
    assert projected(store, "r") == replayed(history)


def test_a_claim_ahead_of_the_clock_then_a_legitimate_steal_is_not_fresh(store: fencepost.Store) -> None:
    """Issue 11 (2b): claimed with now_ms 8 s ahead of the store clock, activated (heartbeat from
    the clock), stolen once that heartbeat is stale: the steal records what it compared."""
    t0 = store.clock.now_ms()
    store.runs.create("r", "{}")
    claimed = store.runs.claim("r", PENDING, A, t0 + 8_000)
    assert isinstance(claimed, Claimed)
    assert isinstance(store.runs.activate("r", A, claimed.claimed_at_ms, PENDING), Activated)
    store.clock.advance(30_001)
    now = store.clock.now_ms()
    snap = store.runs.get("r").snapshot()
    assert snap.heartbeat_at_ms == t0
    assert isinstance(store.runs.steal("r", snap, B, now, LivenessEvidence(A, now, "cross-host-unreachable-stale")),
                      Claimed)
    assert isinstance(store.runs.activate("r", B, now, snap), Activated)
    kinds = dict(facts(store, "r")[1:3])
    assert kinds["activated"]["heartbeatAtMs"] == t0
    assert kinds["stolen"] == {"runId": "r", "owner": B.to_json(), "grantedAtMs": now, "holder": A.to_json(),
                               "holderHeartbeatAtMs": t0, "cutoffMs": now - 30_000,
                               "evidence": "cross-host-unreachable-stale"}
    history = ownership_history(store, "r")
    assert history.ok, history.violations
    assert [(i.owner, i.ended_by) for i in history.intervals] == [(A, "stolen"), (B, None)]
    assert projected(store, "r") == replayed(history)


def test_two_hosts_whose_clocks_are_8_s_apart_hand_a_run_over_cleanly(store: fencepost.Store) -> None:
    """Issue 11 (2b): host B's clock reads 8 s ahead of the store's, host C's 8 s behind. B claims
    and activates (heartbeat from the store clock), goes quiet; C takes over with evidence as soon
    as B's heartbeat is stale by C's own reading."""
    t0 = store.clock.now_ms()
    store.runs.create("r", "{}")
    claimed = store.runs.claim("r", PENDING, B, t0 + 8_000)
    assert isinstance(store.runs.activate("r", B, claimed.claimed_at_ms, PENDING), Activated)
    store.clock.advance(38_001)
    now_c = store.clock.now_ms() - 8_000
    snap = store.runs.get("r").snapshot()
    ev = LivenessEvidence(B, now_c, "cross-host-unreachable-stale")
    assert isinstance(store.runs.claim_and_own("r", snap, C, now_c, ev), Activated)
    history = ownership_history(store, "r")
    assert history.ok, history.violations
    assert [(i.owner, i.ended_by) for i in history.intervals] == [(B, "stolen"), (C, None)]
    assert projected(store, "r") == replayed(history)


def test_a_recovered_claim_records_the_cutoff_and_evidence(store: fencepost.Store) -> None:
    t0 = store.clock.now_ms()
    store.runs.create("r", "{}")
    claimed = store.runs.claim("r", PENDING, A, t0)
    store.clock.advance(30_001)
    now = store.clock.now_ms()
    outcome = store.runs.recover_claim("r", A, claimed.claimed_at_ms, B, now, LivenessEvidence(A, now, "lease-expired"))
    assert type(outcome).__name__ == "Recovered"
    kind, payload = facts(store, "r")[-1]
    assert kind == "expired" and payload["cutoffMs"] == now - 30_000 and payload["observer"] == B.to_json()
    assert payload["evidence"] == "lease-expired" and ownership_history(store, "r").ok


# ---------------------------------------------------------------------------- 3. the projection
def test_a_steal_then_abandoned_changes_no_owner_in_replay_or_projection(store: fencepost.Store) -> None:
    """Issue 11 (3), seed RS-26: B steals then abandons; A remains owner, heartbeats and completes.
    One interval, A's, ended ``released``, in both readers."""
    t0 = store.clock.now_ms()
    own(store, "r", A, t0)
    store.clock.advance(31_000)
    now = store.clock.now_ms()
    snap = store.runs.get("r").snapshot()
    assert isinstance(store.runs.steal("r", snap, B, now, LivenessEvidence(A, now, "lease-expired")), Claimed)
    assert isinstance(store.runs.abandon_claim("r", B, now), Abandoned)
    assert isinstance(store.runs.heartbeat("r", A, now), Updated)
    assert isinstance(store.runs.transition_owned("r", A, "completed"), Transitioned)
    history = ownership_history(store, "r")
    assert history.ok, history.violations
    assert [(i.owner, i.ended_by) for i in history.intervals] == [(A, "released")]
    assert projected(store, "r") == replayed(history)


def test_upstream_ownership_sequences_replay_clean_and_the_projection_agrees(store: fencepost.Store) -> None:
    """OT-01, OT-03, OT-04 (a, b, c), RS-26, RS-28 driven through the real store: every history
    replays with zero violations, the intervals are the expected ones, and the projection's
    intervals equal replay's."""
    runs, clock = store.runs, store.clock
    t0 = clock.now_ms()
    observer = OwnerId("host-b", 303, "observer")
    # OT-01: two-phase claim, heartbeat, complete.
    own(store, "ot-01", A, t0)
    assert isinstance(runs.heartbeat("ot-01", A, t0), Updated)
    assert isinstance(runs.transition_owned("ot-01", A, "completed"), Transitioned)
    # OT-04 (a) abandon, (b) activate with a moved snapshot, (c) recover a stale claim.
    for rid in ("ot-04a", "ot-04b", "ot-04c"):
        runs.create(rid, "{}")
        assert isinstance(runs.claim(rid, PENDING, A, t0), Claimed)
    assert isinstance(runs.abandon_claim("ot-04a", A, t0), Abandoned)
    assert type(runs.activate("ot-04b", A, t0, RunSnapshot("suspended", None, None))).__name__ == "SnapshotChanged"
    # OT-03 and RS-26/RS-28 need stale owners.
    for rid in ("ot-03-steal", "ot-03-take", "rs-26", "rs-28"):
        own(store, rid, A, t0)
    clock.advance(30_001)
    now = clock.now_ms()
    ev = LivenessEvidence(A, now, "cross-host-unreachable-stale")
    recovered = runs.recover_claim("ot-04c", A, t0, observer, now, LivenessEvidence(A, now, "lease-expired"))
    assert type(recovered).__name__ == "Recovered"
    assert isinstance(runs.steal("ot-03-steal", runs.get("ot-03-steal").snapshot(), B, now, ev), Claimed)
    assert isinstance(runs.claim_and_own("ot-03-take", runs.get("ot-03-take").snapshot(), B, now, ev), Activated)
    snap = runs.get("rs-26").snapshot()
    assert isinstance(runs.steal("rs-26", snap, B, now, ev), Claimed)
    assert isinstance(runs.abandon_claim("rs-26", B, now), Abandoned)
    row = runs.get("rs-26")
    assert (row.owner, row.heartbeat_at_ms, row.claimant) == (A, t0, None)
    snap = runs.get("rs-28").snapshot()
    assert isinstance(runs.steal("rs-28", snap, B, now, ev), Claimed)
    assert isinstance(runs.activate("rs-28", B, now, snap), Activated)
    assert type(runs.heartbeat("rs-28", A, now + 1)).__name__ == "FenceLost"
    expected = {
        "ot-01": [(A, "released")], "ot-04a": [], "ot-04b": [], "ot-04c": [],
        "ot-03-steal": [(A, None)], "ot-03-take": [(A, "stolen"), (B, None)],
        "rs-26": [(A, None)], "rs-28": [(A, "stolen"), (B, None)],
    }
    for rid, intervals in expected.items():
        history = ownership_history(store, rid)
        assert history.ok, (rid, history.violations)
        assert [(i.owner, i.ended_by) for i in history.intervals] == intervals, rid
        assert projected(store, rid) == replayed(history), rid


def forge(store: fencepost.Store, run_id: str, kind: str, payload: dict) -> None:
    """A fact no store operation writes, on the run's companion stream (as someone with access could)."""
    store.db.write(lambda conn: store.journal.append_in(
        conn, companion_stream(run_id), f"flows.consensus.{kind}", payload, source_id="flows.run-store",
        meta={"runId": run_id}))


def test_the_projection_applies_no_fact_that_replay_reports_as_malformed(store: fencepost.Store) -> None:
    """Defect: replay skips a fact whose ``grantedAtMs`` or evidence members are malformed
    (``malformed_fact``) or whose payload names no run (``wrong_run``), but the ``OwnershipHistory``
    projection applied the first two (a malformed grant read as ``None``: a forged activation opened
    a second interval, a forged release closed the owner's) and stopped with ``decode_failed`` on the
    third, for good. The projection now applies exactly the facts replay applies, and keeps going."""
    t0 = store.clock.now_ms()
    forged = {
        "grant-text": [("activated", {"runId": "grant-text", "owner": B.to_json(), "grantedAtMs": "5"})],
        "grant-float": [("released", {"runId": "grant-float", "owner": A.to_json(), "grantedAtMs": 1.5})],
        "bad-evidence": [("stolen", {"runId": "bad-evidence", "owner": B.to_json(), "grantedAtMs": t0 + 1,
                                     "holderHeartbeatAtMs": "x"})],
        "no-run-id": [("released", {"owner": A.to_json(), "grantedAtMs": None})],
    }
    for rid, facts_ in forged.items():
        own(store, rid, A, t0)
        for kind, payload in facts_:
            forge(store, rid, kind, payload)
    own(store, "after", C, t0)  # a run whose facts come after every forged one: the projection gets there
    for rid in [*forged, "after"]:
        history = ownership_history(store, rid)
        assert [(i.owner, i.ended_by) for i in history.intervals] == [(C if rid == "after" else A, None)], rid
        assert projected(store, rid) == replayed(history), rid
    assert {v.rule for rid in forged for v in ownership_history(store, rid).violations} == {
        "malformed_fact", "wrong_run"}
