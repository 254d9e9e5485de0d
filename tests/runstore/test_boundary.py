"""Boundary validation, bad input writes nothing, strict decoding (UPSTREAM-TESTS A1 RS-02/03/06/08, A6)."""

from __future__ import annotations

import math

import pytest

from fencepost import LivenessEvidence, OwnerId, RunSnapshot, RunStoreError
from fencepost.journal import companion_stream

from ._corrupt import disable_check_constraints
from .conftest import PENDING, A, activate_new, count, ev, fresh, raw_exec, revision, running

SECRET = "sk-live-SECRETSECRETSECRET"

BAD_IDS = ["", "run-\ud800", "run-\udc00", "a\x00b", "x" * 1025, 5, None, b"run"]
BAD_IDS_IDS = ["empty", "high-surrogate", "low-surrogate", "nul", "1025-units", "int", "none", "bytes"]
BAD_OWNERS = [None, "host-a", ("host-a", 1, "n"), OwnerId("", 1, "n"), OwnerId("h", -1, "n"), OwnerId("h", 1.5, "n"),
              OwnerId("h", True, "n"), OwnerId("h", 1, ""), OwnerId("h\ud800", 1, "n"), OwnerId("h", 2**53, "n")]
BAD_OWNER_IDS = ["none", "str", "tuple", "empty-host", "neg-pid", "frac-pid", "bool-pid", "empty-nonce",
                 "surrogate-host", "unsafe-pid"]
BAD_TIMES = [-1, 1.5, math.nan, math.inf, 2**53, True, SECRET, {"t": SECRET}]
BAD_TIME_IDS = ["neg", "frac", "nan", "inf", "2^53", "bool", "secret-str", "secret-dict"]


def _ops(run_id="r", owner=A, now=0, token=0, expected=PENDING, evidence=None):
    """Every public mutating method, as (name, thunk) pairs over the given arguments."""
    e = evidence if evidence is not None else ev(A, A, 0)
    return [
        ("create", lambda r: r.create(run_id, "{}")),
        ("claim", lambda r: r.claim(run_id, expected, owner, now)),
        ("claim_and_own", lambda r: r.claim_and_own(run_id, expected, owner, now)),
        ("activate", lambda r: r.activate(run_id, owner, token, expected)),
        ("abandon_claim", lambda r: r.abandon_claim(run_id, owner, token)),
        ("recover_claim", lambda r: r.recover_claim(run_id, owner, token, owner, now, e)),
        ("steal", lambda r: r.steal(run_id, running(A, 0), owner, now, e)),
        ("heartbeat", lambda r: r.heartbeat(run_id, owner, now)),
        ("heartbeat_many", lambda r: r.heartbeat_many(owner, [run_id], now)),
        ("reconfirm", lambda r: r.reconfirm(run_id, owner, now)),
        ("transition_owned", lambda r: r.transition_owned(run_id, owner, "completed")),
        ("request_cancel", lambda r: r.request_cancel(run_id, now)),
        ("request_cancel_lineage", lambda r: r.request_cancel_lineage(run_id, now)),
        ("acknowledge_cancel", lambda r: r.acknowledge_cancel(run_id, owner, now)),
    ]


def _assert_refused(store, thunk):
    before = (revision(store), count(store, "flows_journal_events"), count(store, "flows_consensus_leases"))
    with pytest.raises(RunStoreError) as e:
        thunk(store.runs)
    assert e.value.code == "invalid_run"
    assert SECRET not in str(e.value) and SECRET not in repr(getattr(e.value, "cause", None))
    assert (revision(store), count(store, "flows_journal_events"), count(store, "flows_consensus_leases")) == before


@pytest.mark.parametrize("bad", BAD_IDS, ids=BAD_IDS_IDS)
def test_every_method_refuses_malformed_run_ids_and_writes_nothing(mstore, bad):
    """RS-02, LN-02, bad input: the revision, the journal and the leases do not move."""
    seed = fresh()
    activate_new(mstore, seed, A)
    for name, thunk in _ops(run_id=bad):
        if name != "heartbeat_many":
            _assert_refused(mstore, thunk)
    _assert_refused(mstore, lambda r: r.heartbeat_many(A, [seed, bad], 0))


@pytest.mark.parametrize("bad", BAD_OWNERS, ids=BAD_OWNER_IDS)
def test_every_owned_method_refuses_malformed_owners(mstore, bad):
    """BD-02, AB-02 analogue: owners are exact OwnerId triples of durable text and a safe pid."""
    rid = fresh()
    activate_new(mstore, rid, A)
    for name, thunk in _ops(run_id=rid, owner=bad):
        if name not in ("create", "request_cancel", "request_cancel_lineage"):
            _assert_refused(mstore, thunk)


@pytest.mark.parametrize("bad", BAD_TIMES, ids=BAD_TIME_IDS)
def test_every_timestamp_is_a_safe_integer_and_never_echoed(mstore, bad):
    """RX-06: invalid_run with cause {field, detail}; the secret appears nowhere."""
    rid = fresh()
    activate_new(mstore, rid, A)
    for name, thunk in _ops(run_id=rid, now=bad):
        if name not in ("create", "activate", "abandon_claim", "transition_owned"):
            _assert_refused(mstore, thunk)
    for name, thunk in _ops(run_id=rid, token=bad):
        if name in ("activate", "abandon_claim", "recover_claim"):
            _assert_refused(mstore, thunk)
    with pytest.raises(RunStoreError) as e:
        mstore.runs.claim(rid, PENDING, A, bad)
    assert e.value.cause == {"field": "now_ms", "detail": "must be a non-negative safe integer"}


@pytest.mark.parametrize("bad", [
    None, "not evidence", LivenessEvidence(A, 0, "unknown"), LivenessEvidence(A, -1, "lease-expired"),
    LivenessEvidence(None, 0, "lease-expired"), LivenessEvidence(OwnerId("", 1, "n"), 0, "lease-expired"),
], ids=["none", "str", "kind", "time", "no-owner", "bad-owner"])
def test_malformed_evidence_is_invalid_run(mstore, bad):
    """BD-04: steal with evidence null / kind unknown; recover likewise; claim_and_own only when given."""
    rid = fresh()
    activate_new(mstore, rid, A)
    _assert_refused(mstore, lambda r: r.steal(rid, running(A, 0), A, 0, bad))
    _assert_refused(mstore, lambda r: r.recover_claim(rid, A, 0, A, 0, bad))
    if bad is not None:
        _assert_refused(mstore, lambda r: r.claim_and_own(rid, running(A, 0), A, 0, bad))


@pytest.mark.parametrize("state", [None, 42, {"a": 1}, "not-json", '{"a":NaN}', '{"a":Infinity}', '"\\ud800"',
                                   '"a\\u0000"', "\ud800", "[" * 129 + "]" * 129],
                         ids=["none", "int", "dict", "not-json", "nan", "infinity", "escaped-surrogate",
                              "escaped-nul", "raw-surrogate", "depth-129"])
def test_state_json_must_be_durable_json_text(mstore, state):
    """BD-03, RS-03, RS-06: create and transition_owned refuse; stored state unchanged."""
    rid = fresh()
    activate_new(mstore, rid, A)
    _assert_refused(mstore, lambda r: r.create(fresh(), state))
    if state is not None:  # None is "keep the state" for a transition
        _assert_refused(mstore, lambda r: r.transition_owned(rid, A, "running", state))
    assert mstore.runs.get(rid).state_json == "{}"


def test_state_json_limits_are_public_constants(runs):
    """Seed durable-values.md: depth 128 passes, nodes over 100 000 fail."""
    from fencepost import RunStore

    assert (RunStore.MAXIMUM_RUN_JSON_DEPTH, RunStore.MAXIMUM_RUN_JSON_NODES) == (128, 100_000)
    runs.create("deep", "[" * 128 + "]" * 128)
    with pytest.raises(RunStoreError) as e:
        runs.create("wide", "[" + ",".join(["0"] * 100_001) + "]")
    assert "100000" in str(e.value)


def test_invalid_state_error_is_short_and_value_free(runs):
    """RX-07, RX-08: a 200 KB invalid text with a secret: cause names length and validity only."""
    text = '{"key":"' + SECRET + '",' + " " * 200_000
    with pytest.raises(RunStoreError) as e:
        runs.create("r", text)
    assert len(str(e.value)) < 2000 and SECRET not in str(e.value)
    assert e.value.cause == {"field": "state_json", "runId": "r", "stateJsonLength": len(text), "stateJsonValid": False}


def test_run_state_is_never_redacted(store):
    """RX-01, RX-02, RX-03: names ending in token/secret are flow data, stored verbatim."""
    state = '{"payload":{"pageToken":"page-2","clientSecret":{"rotationMs":900,"scopes":["read"]},"retries":3},' \
            '"apiKey":"synthetic-credential"}'
    store.runs.create("r", state)
    assert store.runs.get("r").state_json == state
    store.runs.claim_and_own("r", PENDING, A, 0)
    store.runs.transition_owned("r", A, "running", state.replace("3", "4"))
    assert store.runs.get("r").state_json == state.replace("3", "4")


def test_duplicate_create_and_missing_parent_are_constraint(runs):
    """RS-08 (part), create table: duplicate id, missing FK parent, duplicate (lineage, round)."""
    runs.create("r", "{}")
    for call in (lambda: runs.create("r", "{}"), lambda: runs.create("x", "{}", parent_run_id="nope")):
        with pytest.raises(RunStoreError) as e:
            call()
        assert e.value.code == "constraint"
    runs.create("l0", "{}", lineage_id="L", round_ordinal=0)
    with pytest.raises(RunStoreError) as e:
        runs.create("l0b", "{}", lineage_id="L", round_ordinal=0)
    assert e.value.code == "constraint"
    with pytest.raises(RunStoreError) as e:
        runs.get("missing")
    assert e.value.code == "not_found_row"




CORRUPTIONS = {
    "created-negative": "DELETE FROM flows_runs; INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) "
                        "VALUES ('r', 'pending', '{}', -1)",
    "owner-without-nonce": "UPDATE flows_runs SET owner_host_id = 'h', owner_pid = 1",
    "heartbeat-on-pending": "UPDATE flows_runs SET heartbeat_at_ms = 5",
    "running-without-owner": "UPDATE flows_runs SET status = 'running', heartbeat_at_ms = 5",
    "claim-host-only": "UPDATE flows_runs SET claim_host_id = 'h'",
    "claimed-at-only": "UPDATE flows_runs SET claimed_at_ms = 5",
    "claim-without-time": "UPDATE flows_runs SET claim_host_id = 'h', claim_pid = 1, claim_nonce = 'n'",
    "state-not-json": "UPDATE flows_runs SET state_json = 'not-json'",
    "unknown-status": "UPDATE flows_runs SET status = 'unknown', cancel_requested_at_ms = 1",
    "suspended-with-owner-and-secret": "UPDATE flows_runs SET status = 'suspended', owner_host_id = 'h', "
                                       f"owner_pid = 1, owner_nonce = 'n', state_json = '{{\"k\":\"{SECRET}\"}}'",
}


@pytest.mark.parametrize("sql", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_corrupt_rows_fail_decode_without_values(store, sql):
    """RS-08 (eight decode_failed), RS-19/RX-09: rows written with the CHECK constraints out of the way.

    RM-19: the unknown-status row carrying a cancel request also fails ``request_cancel`` as ``decode_failed``.
    """
    store.runs.create("r", "{}")
    with store.db.connect() as conn:
        disable_check_constraints(conn, "flows_runs")
        for stmt in sql.split("; "):
            conn.exec_driver_sql(stmt)
        conn.commit()
    with pytest.raises(RunStoreError) as e:
        store.runs.get("r")
    assert e.value.code == "decode_failed"
    assert SECRET not in str(e.value) and SECRET not in repr(e.value.cause)
    if "secret" in sql.lower() and "suspended" in sql:
        assert e.value.cause["hasOwnerColumns"] is True and e.value.cause["hasClaimColumns"] is False
        assert e.value.cause["stateJsonValid"] is True
    if "unknown" in sql:
        with pytest.raises(RunStoreError) as e2:
            store.runs.request_cancel("r", 5)
        assert e2.value.code == "decode_failed"


def test_dropped_table_is_persistence_failed(store):
    """RS-08 (last two): create and get over a dropped flows_runs."""
    raw_exec(store, "DROP TABLE flows_attempts")
    raw_exec(store, "DROP TABLE flows_runs" + (" CASCADE" if store.db.name == "postgresql" else ""))
    for call in (lambda: store.runs.create("r", "{}"), lambda: store.runs.get("r")):
        with pytest.raises(RunStoreError) as e:
            call()
        assert e.value.code == "persistence_failed"


def test_companion_ids_are_refused_but_a_companion_lookalike_elsewhere_is_fine(runs):
    """OT-08 complement: only the exact prefix is reserved."""
    with pytest.raises(RunStoreError):
        runs.create(companion_stream("x"), "{}")
    runs.create("flows.companionX/run", "{}")


def test_snapshot_expected_accepts_only_the_three_guarded_fields(store):
    """RS-48 complement: a RunSnapshot built from a row equals RunRow.snapshot()."""
    activate_new(store, "r", A)
    row = store.runs.get("r")
    assert row.snapshot() == RunSnapshot("running", A, 0)


class _FlakyOwner(OwnerId):
    """An ``OwnerId`` subclass whose ``host_id`` raises on its second read."""

    reads = 0

    @property
    def host_id(self):  # type: ignore[override]
        _FlakyOwner.reads += 1
        if _FlakyOwner.reads > 1:
            raise RuntimeError("second read")
        return "host-a"


def test_an_owner_is_never_read_through_a_subclass(mstore):
    """BD-01 [JS] analogue: owners are exact, frozen ``OwnerId`` values taken once per call; a subclass
    whose ``host_id`` raises on a second read is ``invalid_run`` on every call, the same answer each
    time, with no read through it; a plain owner on a missing run is ``NotFound``."""
    _FlakyOwner.reads = 0
    flaky = _FlakyOwner("host-a", 101, "owner-a")
    for _ in range(2):
        with pytest.raises(RunStoreError) as e:
            mstore.runs.heartbeat("missing", flaky, 0)
        assert e.value.code == "invalid_run"
    assert _FlakyOwner.reads == 0
    assert type(mstore.runs.heartbeat("missing", A, 0)).__name__ == "NotFound"
