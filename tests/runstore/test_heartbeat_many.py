"""``runs.heartbeat_many``: many leases renewed in ONE write transaction, per-run heartbeat semantics."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from fencepost import FenceLost, NotFound, RunStoreError, Updated

from .conftest import PENDING, A, B, fresh, lease, revision


def _own(store, owner, n, now):
    ids = [fresh("hb") for _ in range(n)]
    for rid in ids:
        store.runs.create(rid, "{}")
        store.runs.claim_and_own(rid, PENDING, owner, now)
    return ids


def test_outcomes_match_single_heartbeats(mstore):
    """Updated / FenceLost / NotFound per run, exactly as heartbeat would answer each."""
    t = mstore.clock.now_ms()
    mine = _own(mstore, A, 3, t)
    theirs = _own(mstore, B, 1, t)
    parked = _own(mstore, A, 1, t)
    mstore.runs.transition_owned(parked[0], A, "suspended")
    missing = fresh("missing")
    ids = [*mine, *theirs, *parked, missing, mine[0]]
    got = mstore.runs.heartbeat_many(A, ids, t + 5)
    assert list(got) == [*mine, *theirs, *parked, missing]  # request order, duplicates answered once
    assert [got[r] for r in mine] == [Updated(t + 5)] * 3
    assert got[theirs[0]] == FenceLost() and got[parked[0]] == FenceLost() and got[missing] == NotFound()
    assert all(mstore.runs.get(r).heartbeat_at_ms == t + 5 for r in mine)
    assert mstore.runs.get(theirs[0]).heartbeat_at_ms == t
    # and the single-run operation agrees, run by run
    for rid in ids:
        assert mstore.runs.heartbeat(rid, A, t + 5) == got[rid]


def test_late_reading_and_lease_ahead_never_move_back(mstore):
    t = mstore.clock.now_ms()
    a, b = _own(mstore, A, 2, t)
    mstore.runs.heartbeat(a, A, t + 9)
    mstore.db.write(lambda c: mstore.consensus.heartbeat(c, b, A, t + 7))  # the lease ahead of the row
    got = mstore.runs.heartbeat_many(A, [a, b], t + 3)
    assert got == {a: Updated(t + 9), b: Updated(t + 7)}
    assert (mstore.runs.get(a).heartbeat_at_ms, mstore.runs.get(b).heartbeat_at_ms) == (t + 9, t + 7)
    assert lease(mstore, b)[3] == t + 7


def test_all_runs_renew_in_one_write_transaction(mstore):
    t = mstore.clock.now_ms()
    ids = _own(mstore, A, 20, t)
    commits = []
    listener = lambda conn: commits.append(1)  # noqa: E731
    event.listen(mstore.db.engine, "commit", listener)
    try:
        got = mstore.runs.heartbeat_many(A, ids, t + 1)
    finally:
        event.remove(mstore.db.engine, "commit", listener)
    assert len(commits) == 1 and set(got.values()) == {Updated(t + 1)}


def test_a_failure_rolls_back_every_renewal(mstore):
    """The batch is one transaction: an error in it leaves no run renewed."""
    t = mstore.clock.now_ms()
    ids = _own(mstore, A, 3, t)
    before = revision(mstore)

    class Boom(Exception):
        pass

    def body(conn):
        mstore.runs.heartbeat_many(A, ids, t + 2)
        raise Boom

    with pytest.raises(Boom):
        mstore.db.write(body)
    assert revision(mstore) == before
    assert {mstore.runs.get(r).heartbeat_at_ms for r in ids} == {t}


@pytest.mark.parametrize("bad", ["run-1", [1], [""], None, 5], ids=["str", "int-id", "empty-id", "none", "int"])
def test_bad_batches_are_refused_whole(mstore, bad):
    before = revision(mstore)
    with pytest.raises(RunStoreError) as e:
        mstore.runs.heartbeat_many(A, bad, 0)
    assert e.value.code == "invalid_run" and revision(mstore) == before


def test_a_bad_id_is_named_by_its_index(mstore):
    """The refusal said ``run_ids[] must not be empty``: which of a thousand ids was bad went
    unsaid. It now names the index, as ``read`` and ``create_many`` do. Both backends."""
    t = mstore.clock.now_ms()
    ids = _own(mstore, A, 2, t)
    before = revision(mstore)
    with pytest.raises(RunStoreError) as e:
        mstore.runs.heartbeat_many(A, [*ids, "", ids[0]], t + 1)
    assert e.value.code == "invalid_run" and "run_ids[2] must not be empty" in str(e.value)
    assert revision(mstore) == before and {mstore.runs.get(r).heartbeat_at_ms for r in ids} == {t}


def test_empty_batch_and_skew_bound(mstore):
    assert mstore.runs.heartbeat_many(A, [], 0) == {}
    with pytest.raises(RunStoreError):
        mstore.runs.heartbeat_many(A, [fresh()], mstore.clock.now_ms() + 10_001)


def test_thousands_of_runs_in_one_call(mstore):
    """A worker keeps thousands of runs alive with one call per interval (bench/ measures 10 000)."""
    t = mstore.clock.now_ms()
    n = 2_000
    ids = [fresh("bulk") for _ in range(n)]
    with mstore.db.connect() as conn:  # seed owned rows and leases in bulk, behind the store
        conn.execute(
            __import__("fencepost")._schema.flows_runs.insert(),
            [{"run_id": r, "status": "running", "state_json": "{}", "created_at_ms": t, "started_at_ms": t,
              "heartbeat_at_ms": t, "owner_host_id": A.host_id, "owner_pid": A.pid, "owner_nonce": A.nonce}
             for r in ids])
        conn.execute(
            __import__("fencepost")._schema.flows_consensus_leases.insert(),
            [{"run_id": r, "owner_host_id": A.host_id, "owner_pid": A.pid, "owner_nonce": A.nonce,
              "granted_at_ms": t, "heartbeat_at_ms": t} for r in ids])
        conn.commit()
    got = mstore.runs.heartbeat_many(A, ids, t + 1)
    assert len(got) == n and set(got.values()) == {Updated(t + 1)}
