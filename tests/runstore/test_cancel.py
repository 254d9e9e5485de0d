"""Cancellation intent, lineage and acknowledgement (UPSTREAM-TESTS A3 ER-02, A4, A5)."""

from __future__ import annotations

import math
from functools import partial

import msgspec
import pytest

from fencepost import (
    AlreadyRequested,
    CancelRequested,
    FenceLost,
    GuardFailed,
    NotFound,
    OwnerId,
    RunStore,
    RunStoreError,
    Terminal,
    Transitioned,
)
from tests.conftest import race_threads

from .conftest import PENDING, A, B, activate_new, revision


def _lineage(store):
    store.runs.create("root", "{}", lineage_id="root", round_ordinal=0)
    store.runs.create("next", "{}", parent_run_id="root", lineage_id="root", round_ordinal=1)


def test_lineage_request_writes_every_live_round_at_once(store):
    """LN-01 (second half), LN-03."""
    _lineage(store)
    store.runs.request_cancel("next", 100)
    assert store.runs.request_cancel_lineage("root", 200) == CancelRequested(200)
    assert [r.cancel_requested_at_ms for r in store.runs.lineage("root")] == [200, 100]


@pytest.mark.parametrize("bad", ["", "\ud800", 1, None], ids=["empty", "surrogate", "int", "none"])
def test_lineage_operations_refuse_bad_ids(store, bad):
    """LN-02."""
    _lineage(store)
    before = revision(store)
    for op in (store.runs.lineage, store.runs.latest_round):
        with pytest.raises(RunStoreError) as e:
            op(bad)
        assert e.value.code == "invalid_run"
    with pytest.raises(RunStoreError):
        store.runs.request_cancel_lineage(bad, 1)
    assert revision(store) == before


@pytest.mark.parametrize("t", [-1, 0.5, math.nan, math.inf, 2**53, True, "5"],
                         ids=["neg", "frac", "nan", "inf", "2^53", "bool", "str"])
def test_lineage_request_refuses_bad_times(store, t):
    """LN-02, RM-15, RX-06: cause is exactly {field, detail}; nothing written."""
    _lineage(store)
    before = revision(store)
    for op in (store.runs.request_cancel_lineage, store.runs.request_cancel):
        with pytest.raises(RunStoreError) as e:
            op("root", t)
        assert e.value.code == "invalid_run"
        assert e.value.cause == {"field": "now_ms", "detail": "must be a non-negative safe integer"}
    assert revision(store) == before


def test_completed_predecessor_is_never_rewritten(store):
    """LN-04."""
    store.runs.create("root", "{}", lineage_id="root", round_ordinal=0)
    store.runs.claim_and_own("root", PENDING, A, 0)
    store.runs.transition_owned("root", A, "completed")
    store.runs.create("next", "{}", lineage_id="root", round_ordinal=1)
    assert store.runs.request_cancel_lineage("root", 100) == CancelRequested(100)
    assert store.runs.request_cancel_lineage("next", 200) == AlreadyRequested(100)
    assert store.runs.request_cancel_lineage("missing", 300) == NotFound()
    assert store.runs.get("root").cancel_requested_at_ms is None


def test_lineage_membership_and_latest_round(store):
    """LN-05."""
    r = store.runs
    r.create("root", "{}")
    r.create("second", "{}", lineage_id="root", round_ordinal=1)
    r.create("third", "{}", parent_run_id="second", lineage_id="root", round_ordinal=2)
    r.create("fork", "{}", parent_run_id="root", lineage_id="fork", round_ordinal=0)
    r.create("other", "{}")
    for rid in ("root", "second", "third"):
        assert [x.run_id for x in r.lineage(rid)] == ["root", "second", "third"]
        assert r.latest_round(rid).run_id == "third"
    assert [x.run_id for x in r.lineage("fork")] == ["fork"]
    assert [x.run_id for x in r.lineage("other")] == ["other"]
    assert r.lineage("missing") == []
    assert r.latest_round("other").run_id == "other"
    with pytest.raises(RunStoreError) as e:
        r.latest_round("missing")
    assert e.value.code == "not_found_row"


def test_lineage_names_do_not_leak_between_lineages(store):
    """LN-06."""
    store.runs.create("shared-name", "{}", lineage_id="independent-lineage", round_ordinal=0)
    store.runs.create("target", "{}", lineage_id="shared-name", round_ordinal=0)
    assert [x.run_id for x in store.runs.lineage("target")] == ["target"]
    assert [x.run_id for x in store.runs.lineage("shared-name")] == ["shared-name"]
    assert store.runs.request_cancel_lineage("target", 100) == CancelRequested(100)
    assert store.runs.get("shared-name").cancel_requested_at_ms is None


def test_all_settled_lineage_reports_last_terminal_round(store):
    """LN-08, LN-09."""
    for i, end in enumerate(["completed", "completed", "failed"]):
        store.runs.create(f"r{i}", "{}", lineage_id="r0", round_ordinal=i)
        store.runs.claim_and_own(f"r{i}", PENDING, A, 0)
        store.runs.transition_owned(f"r{i}", A, end)
    assert store.runs.request_cancel_lineage("r0", 100) == Terminal("failed")
    assert store.runs.request_cancel_lineage("r2", 100) == Terminal("failed")
    store.runs.create("l0", "{}", lineage_id="l0", round_ordinal=0)
    store.runs.request_cancel("l0", 50)
    store.runs.create("l1", "{}", lineage_id="l0", round_ordinal=1)
    store.runs.claim_and_own("l1", PENDING, A, 0)
    store.runs.transition_owned("l1", A, "cancelled")
    assert store.runs.request_cancel_lineage("l1", 100) == AlreadyRequested(50)


def test_parent_and_round_metadata_round_trip(store):
    """RM-01, RM-02."""
    store.runs.create("parent", "{}")
    store.runs.create("child", "{}", parent_run_id="parent")
    store.runs.create("round-1", "{}", parent_run_id="parent", lineage_id="parent", round_ordinal=1)
    assert store.runs.get("child").parent_run_id == "parent"
    row = store.runs.get("round-1")
    assert (row.parent_run_id, row.lineage_id, row.round_ordinal) == ("parent", "parent", 1)
    p = store.runs.get("parent")
    assert (p.parent_run_id, p.cancel_requested_at_ms, p.lineage_id, p.round_ordinal) == (None, None, None, None)


def test_parent_links_walk_back_to_the_root_in_sql(store, raw):
    """RM-03: with a <- b <- c by parent_run_id, a recursive SQL walk from c yields [c, b, a]."""
    store.runs.create("a", "{}")
    store.runs.create("b", "{}", parent_run_id="a")
    store.runs.create("c", "{}", parent_run_id="b")
    walk = raw.exec_driver_sql(
        "WITH RECURSIVE up(run_id, parent_run_id, depth) AS ("
        " SELECT run_id, parent_run_id, 0 FROM flows_runs WHERE run_id = 'c'"
        " UNION ALL SELECT r.run_id, r.parent_run_id, up.depth + 1 FROM flows_runs r"
        " JOIN up ON r.run_id = up.parent_run_id)"
        " SELECT run_id FROM up ORDER BY depth").scalars().all()
    assert walk == ["c", "b", "a"]


def test_request_cancel_first_writer_wins(store, clock):
    """RM-04, RM-05: caller time is request data, not bounded by the store clock."""
    store.runs.create("run", "{}")
    assert store.runs.request_cancel("run", 500) == CancelRequested(500)
    assert store.runs.request_cancel("run", 900) == AlreadyRequested(500)
    assert store.runs.request_cancel("missing", 900) == NotFound()
    clock.set(11_000)
    store.runs.create("late", "{}")
    assert store.runs.request_cancel("late", 1) == CancelRequested(1)


@pytest.mark.parametrize("guard,requested,expected", [
    ({"cancel_requested": "absent"}, True, GuardFailed()),
    ({"cancel_requested": "absent"}, False, Transitioned()),
    ({"cancel_requested": "present"}, False, GuardFailed()),
    ({"cancel_requested": "present"}, True, Transitioned()),
    ({}, True, Transitioned()),
    (None, False, Transitioned()),
], ids=["absent-with-request", "absent-without", "present-without", "present-with", "empty", "none"])
def test_transition_guards(store, guard, requested, expected):
    """RM-06, RM-07, RM-08, BD-04 (guard {} is no guard)."""
    activate_new(store, "r", A)
    if requested:
        store.runs.request_cancel("r", 1)
    to = "cancelled" if guard and guard.get("cancel_requested") == "present" else "completed"
    assert store.runs.transition_owned("r", A, to, guard=guard) == expected
    assert store.runs.get("r").status == (to if expected == Transitioned() else "running")


def test_fence_and_existence_outrank_the_guard(store):
    """RM-09, RM-10."""
    activate_new(store, "r", A)
    store.runs.request_cancel("r", 1)
    g = {"cancel_requested": "absent"}
    assert store.runs.transition_owned("r", B, "completed", guard=g) == FenceLost()
    assert store.runs.transition_owned("missing", A, "completed", guard=g) == NotFound()
    activate_new(store, "p", A)
    assert store.runs.transition_owned("p", A, "running", '{"a":1}', g) == Transitioned()
    store.runs.request_cancel("p", 2)
    assert store.runs.transition_owned("p", A, "running", '{"a":2}', g) == GuardFailed()
    assert store.runs.get("p").state_json == '{"a":1}'


@pytest.mark.parametrize("guard", [{"cancel_requested": "typo"}, {"cancel_requested": "absent", "typo": True},
                                   "absent", ["absent"], {"cancelRequested": "absent"}],
                         ids=["typo-value", "extra-key", "str", "list", "camel-key"])
def test_malformed_guards_are_invalid_run(store, guard):
    """RM-11."""
    activate_new(store, "r", A)
    with pytest.raises(RunStoreError) as e:
        store.runs.transition_owned("r", A, "completed", guard=guard)
    assert e.value.code == "invalid_run"
    row = store.runs.get("r")
    assert (row.status, row.owner) == ("running", A)


def test_transition_to_pending_is_refused(store):
    """RM-12."""
    activate_new(store, "r", A)
    with pytest.raises(RunStoreError):
        store.runs.transition_owned("r", A, "pending")
    assert store.runs.get("r").status == "running"


@pytest.mark.parametrize("kwargs", [
    {"parent_run_id": ""}, {"lineage_id": "l"}, {"round_ordinal": 1}, {"lineage_id": "l", "round_ordinal": -1},
    {"parent_run_id": 1},
], ids=["empty-parent", "lineage-only", "round-only", "negative-round", "int-parent"])
def test_create_option_rules(runs, kwargs):
    """RM-13, RM-14, BD-04."""
    with pytest.raises(RunStoreError) as e:
        runs.create("r", "{}", **kwargs)
    assert e.value.code == "invalid_run"


def test_noop_store_answers_losses():
    """RM-16, ER-02 (noop ack is false), seed compose-the-stores noop table."""
    noop = RunStore.noop()
    assert noop.request_cancel("r", 1) == NotFound()
    assert noop.acknowledge_cancel("r", A, 1) is False
    overridden = RunStore.noop(heartbeat=lambda *a: FenceLost())
    assert overridden.heartbeat("r", A, 0) == FenceLost()


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
def test_concurrent_requests_have_one_writer(store):
    """RM-17."""
    store.runs.create("r", "{}")
    results = race_threads([partial(store.runs.request_cancel, "r", t) for t in (500, 900, 700)])
    winners = [r for r in results if isinstance(r, CancelRequested)]
    assert len(winners) == 1
    w = winners[0].requested_at_ms
    assert sorted(results, key=repr) == sorted([CancelRequested(w), AlreadyRequested(w), AlreadyRequested(w)], key=repr)
    assert store.runs.get("r").cancel_requested_at_ms == w


@pytest.mark.parametrize("end", ["completed", "failed"])
def test_settled_runs_record_no_request(store, end):
    """RM-20, RM-21."""
    activate_new(store, "r", A)
    store.runs.transition_owned("r", A, end)
    assert store.runs.request_cancel("r", 500) == Terminal(end)
    assert store.runs.request_cancel("r", 900) == Terminal(end)
    assert store.runs.get("r").cancel_requested_at_ms is None


def test_cancelled_run_keeps_its_request(store):
    """RM-22."""
    activate_new(store, "r", A)
    store.runs.request_cancel("r", 500)
    store.runs.transition_owned("r", A, "cancelled", guard={"cancel_requested": "present"})
    assert store.runs.request_cancel("r", 900) == Terminal("cancelled")
    assert store.runs.get("r").cancel_requested_at_ms == 500


@pytest.mark.parametrize("state", ["pending", "running", "suspended"])
def test_live_runs_accept_requests(store, state):
    """RM-23."""
    store.runs.create("r", "{}")
    if state != "pending":
        store.runs.claim_and_own("r", PENDING, A, 0)
        if state == "suspended":
            store.runs.transition_owned("r", A, "suspended")
    assert store.runs.request_cancel("r", 500) == CancelRequested(500)


def test_acknowledge_cancel_sequence(store):
    """ER-02: first acknowledgement kept; fenced by owner and intent."""
    runs = store.runs
    runs.create("a", "{}")
    assert runs.acknowledge_cancel("a", A, 2) is False
    runs.claim_and_own("a", PENDING, A, 2)
    assert runs.acknowledge_cancel("a", A, 3) is False
    runs.request_cancel("a", 3)
    assert runs.acknowledge_cancel("a", OwnerId("host-a", 101, "stale"), 4) is False
    assert runs.acknowledge_cancel("a", A, 4) is True
    assert runs.acknowledge_cancel("a", A, 5) is True
    runs.transition_owned("a", A, "cancelled")
    assert runs.acknowledge_cancel("a", A, 6) is False
    ack = runs.get("a").cancel_acknowledgement
    assert ack == {"observedAtMs": 4, "owner": msgspec.to_builtins(A.to_json())}
    with pytest.raises(RunStoreError):
        runs.acknowledge_cancel("", A, 1)


def _trigger(store, name, run_id, action):
    """A BEFORE UPDATE OF cancel_requested_at_ms trigger on one run: ``abort`` or ``ignore``."""
    from .conftest import raw_exec

    if store.db.name == "sqlite":
        body = "SELECT RAISE(ABORT, 'refused');" if action == "abort" else "SELECT RAISE(IGNORE);"
        raw_exec(store, f"CREATE TRIGGER {name} BEFORE UPDATE OF cancel_requested_at_ms ON flows_runs "
                        f"WHEN OLD.run_id = '{run_id}' BEGIN {body} END")
    else:
        stmt = "RAISE EXCEPTION 'refused' USING ERRCODE = '23514';" if action == "abort" else "RETURN NULL;"
        raw_exec(store, f"CREATE FUNCTION {name}_fn() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {stmt} END; $$")
        raw_exec(store, f"CREATE TRIGGER {name} BEFORE UPDATE OF cancel_requested_at_ms ON flows_runs FOR EACH ROW "
                        f"WHEN (OLD.run_id = '{run_id}') EXECUTE FUNCTION {name}_fn()")


def test_lineage_request_is_atomic_when_one_round_refuses(store):
    """LN-01: a refused round fails the whole request; no round keeps a request."""
    from .conftest import raw_exec

    _lineage(store)
    _trigger(store, "refuse_next", "next", "abort")
    with pytest.raises(RunStoreError) as e:
        store.runs.request_cancel_lineage("root", 100)
    assert e.value.code == "constraint"
    assert [r.cancel_requested_at_ms for r in store.runs.lineage("root")] == [None, None]
    raw_exec(store, "DROP TRIGGER refuse_next" + (" ON flows_runs" if store.db.name == "postgresql" else ""))
    assert store.runs.request_cancel_lineage("root", 200) == CancelRequested(200)
    assert [r.cancel_requested_at_ms for r in store.runs.lineage("root")] == [200, 200]


def test_silently_ignored_request_is_a_write_invariant_failure(store):
    """RM-18, LN-10: a live row that refuses the write without an error is persistence_failed."""
    store.runs.create("run", "{}")
    store.runs.create("stuck-0", "{}", lineage_id="stuck-0", round_ordinal=0)
    _trigger(store, "ignore_run", "run", "ignore")
    _trigger(store, "ignore_stuck", "stuck-0", "ignore")
    with pytest.raises(RunStoreError) as e:
        store.runs.request_cancel("run", 500)
    assert e.value.code == "persistence_failed" and e.value.cause == {"runId": "run", "stage": "write-invariant"}
    with pytest.raises(RunStoreError) as e:
        store.runs.request_cancel_lineage("stuck-0", 500)
    assert e.value.cause == {"runId": "stuck-0", "stage": "write-invariant"}
    assert store.runs.get("run").cancel_requested_at_ms is None


@pytest.mark.parametrize("rounds", [2, 200])
def test_lineage_request_is_one_statement_whatever_the_size(mstore, monkeypatch, rounds):
    """LN-07: one statement to request, two to answer AlreadyRequested; state_json never read."""
    from fencepost.runstore import _sql as q

    from .conftest import fresh

    root = fresh("lin")
    state = '{"pad":"' + "x" * 4096 + '"}'
    for i in range(rounds):
        rid = root if i == 0 else f"{root}-{i}"
        mstore.runs.create(rid, state, lineage_id=root, round_ordinal=i)
        if i < rounds - 1:
            mstore.runs.claim_and_own(rid, PENDING, A, mstore.clock.now_ms())
            mstore.runs.transition_owned(rid, A, "completed")
    seen = []
    real = q.run

    def spy(conn, stmt, params):
        seen.append(stmt)
        return real(conn, stmt, params)

    monkeypatch.setattr(q, "run", spy)
    assert mstore.runs.request_cancel_lineage(root, 100) == CancelRequested(100)
    assert seen == [q.REQUEST_CANCEL_LINEAGE]
    seen.clear()
    assert mstore.runs.request_cancel_lineage(root, 200) == AlreadyRequested(100)
    assert seen == [q.REQUEST_CANCEL_LINEAGE, q.LINEAGE_CANCEL_STATE]
    assert all("state_json" not in s.compiled(mstore.db.name)[0] for s in seen)
    monkeypatch.undo()
    assert mstore.runs.get(root).cancel_requested_at_ms is None
    assert mstore.runs.get(f"{root}-{rounds - 1}").cancel_requested_at_ms == 100


def test_lineage_member_with_an_unknown_status_fails_decode(store):
    """LN-11: the live-looking round of a lineage has an unknown stored status (CHECKs off) and a
    request; nothing is left to write, so ``request_cancel_lineage`` reads the rounds and fails
    ``decode_failed``, from either member. (Had another live round taken the request, the answer is
    ``CancelRequested`` from the one UPDATE, without reading the rounds: LN-07.)"""
    from ._corrupt import disable_check_constraints

    _lineage(store)
    store.runs.claim_and_own("root", PENDING, A, 0)
    store.runs.transition_owned("root", A, "completed")
    with store.db.connect() as conn:
        disable_check_constraints(conn, "flows_runs")
        conn.exec_driver_sql("UPDATE flows_runs SET status = 'unknown', cancel_requested_at_ms = 1 "
                             "WHERE run_id = 'next'")
        conn.commit()
    before = revision(store)
    for target in ("root", "next"):
        with pytest.raises(RunStoreError) as e:
            store.runs.request_cancel_lineage(target, 100)
        assert e.value.code == "decode_failed"
    assert revision(store) == before
