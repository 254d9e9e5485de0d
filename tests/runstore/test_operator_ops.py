"""Operator operations on runs: create (one or many), retry a lineage, delete. Both backends."""

from __future__ import annotations

import pytest

from fencepost.errors import RunAlreadyExists, RunStoreError
from fencepost.runstore.outcomes import Claimed, NotFound, Transitioned
from tests.conftest import race_threads
from tests.runstore.conftest import PENDING, A, B, activate_new

RETRIED = "flows.run-store.retried"
DELETED = "flows.run-store.deleted"


def _race(*fns) -> list:
    """Run ``fns`` on threads released by one barrier; each result, or the error's code (its class
    name for a ``RunStoreError`` subclass)."""
    def code(got):
        if not isinstance(got, RunStoreError):
            return got
        return got.code if type(got) is RunStoreError else type(got).__name__

    return [code(got) for got in race_threads(fns, catch=RunStoreError)]


def _events(store, stream: str, event_type: str) -> list:
    return store.journal.entries(stream, event_types=[event_type]).entries


# --------------------------------------------------------------------------- create
def test_a_duplicate_id_says_it_already_exists_and_changes_nothing(store):
    store.runs.create("dup", '{"v": 1}')
    with pytest.raises(RunStoreError) as err:
        store.runs.create("dup", '{"v": 2}')
    assert err.value.code == "constraint" and isinstance(err.value, RunAlreadyExists)
    assert "already exists" in str(err.value) and "dup" not in str(err.value).split(":", 2)[-1]
    assert store.runs.get("dup").state_json == '{"v": 1}'


def test_a_missing_parent_is_still_a_constraint_but_not_already_exists(store):
    with pytest.raises(RunStoreError) as err:
        store.runs.create("orphan", "{}", parent_run_id="nobody")
    assert err.value.code == "constraint" and not isinstance(err.value, RunAlreadyExists)


def test_create_many_is_all_or_nothing(store):
    store.runs.create("taken", "{}")
    with pytest.raises(RunStoreError) as err:
        store.runs.create_many([("m1", "{}"), ("m2", "[1]"), ("taken", "{}")])
    assert isinstance(err.value, RunAlreadyExists) and "runs[2]" in str(err.value)
    with pytest.raises(RunStoreError) as err:
        store.runs.create_many([("m1", "{}"), ("m1", "{}")])
    assert isinstance(err.value, RunAlreadyExists) and "runs[1]" in str(err.value)
    with pytest.raises(RunStoreError) as err:
        store.runs.create_many([("m1", "{}"), ("m2", "{not json")])
    assert err.value.code == "invalid_run" and "runs[1].state_json" in str(err.value)
    for run_id in ("m1", "m2"):
        with pytest.raises(RunStoreError):
            store.runs.get(run_id)
    assert store.runs.create_many([("m1", "{}"), ("m2", "[1]")]) == 2
    assert store.runs.get("m2").state_json == "[1]"


def test_two_creators_of_one_id_race_and_exactly_one_wins(store):
    for round_ in range(10):
        run_id = f"race-{round_}"
        results = _race(*[lambda rid=run_id: store.runs.create(rid, "{}") or "created"] * 2)
        assert sorted(results) == ["RunAlreadyExists", "created"]


# --------------------------------------------------------------------------- retry
def _fail_with(store, run_id: str, state: str) -> None:
    activate_new(store, run_id, A)
    assert isinstance(store.runs.transition_owned(run_id, A, "running", state_json=state), Transitioned)
    assert isinstance(store.runs.transition_owned(run_id, A, "failed"), Transitioned)


def test_retry_starts_a_new_round_from_the_last_checkpoint(store):
    _fail_with(store, "job", '{"step": 2}')
    new = store.runs.retry("job")
    assert new.status == "pending" and new.run_id != "job"
    assert (new.lineage_id, new.round_ordinal, new.parent_run_id) == ("job", 1, "job")
    assert new.state_json == '{"step": 2}'
    assert [r.run_id for r in store.runs.lineage("job")] == ["job", new.run_id]
    assert store.runs.latest_round("job").run_id == new.run_id
    (fact,) = _events(store, "job", RETRIED)
    assert fact.payload == {"runId": new.run_id, "lineageId": "job", "roundOrdinal": 1, "fromRunId": "job"}
    # The new round fails too: retrying by either id continues the same lineage.
    claimed = store.runs.claim(new.run_id, PENDING, B, store.clock.now_ms())
    assert isinstance(claimed, Claimed)
    store.runs.activate(new.run_id, B, claimed.claimed_at_ms, PENDING)
    store.runs.transition_owned(new.run_id, B, "failed", state_json='{"step": 5}')
    third = store.runs.retry("job")
    assert (third.lineage_id, third.round_ordinal, third.parent_run_id) == ("job", 2, new.run_id)
    assert third.state_json == '{"step": 5}'
    assert len(_events(store, "job", RETRIED)) == 2


def test_retry_is_refused_while_the_latest_round_is_live(store):
    store.runs.create("live", "{}")
    with pytest.raises(RunStoreError) as err:
        store.runs.retry("live")
    assert err.value.code == "refused" and "live" in err.value.detail
    assert len(store.runs.lineage("live")) == 1


def test_retry_is_refused_while_the_lineage_has_a_cancellation_request(store):
    activate_new(store, "c", A)
    store.runs.request_cancel("c", store.clock.now_ms())
    store.runs.transition_owned("c", A, "failed")  # it failed anyway; the request stays on the row
    with pytest.raises(RunStoreError) as err:
        store.runs.retry("c")
    assert err.value.code == "refused" and "cancellation" in err.value.detail
    assert len(store.runs.lineage("c")) == 1 and not _events(store, "c", RETRIED)


def test_retry_of_an_unknown_run_is_not_found(store):
    with pytest.raises(RunStoreError) as err:
        store.runs.retry("ghost")
    assert err.value.code == "not_found_row"


def test_retry_races_a_lineage_cancellation_and_never_leaves_an_uncancelled_live_round(store):
    for round_ in range(10):
        run_id = f"rc-{round_}"
        _fail_with(store, run_id, "{}")
        retried, cancel = _race(lambda rid=run_id: store.runs.retry(rid),
                                lambda rid=run_id: type(store.runs.request_cancel_lineage(rid, 1)).__name__)
        live = [r for r in store.runs.lineage(run_id) if r.status == "pending"]
        assert not isinstance(retried, str)  # the lineage had no request when the retry ran first or alone
        if cancel == "Terminal":  # the cancellation came first and found nothing live to cancel
            assert len(live) == 1 and live[0].cancel_requested_at_ms is None
        else:  # the retry came first: the cancellation covered the new round
            assert cancel == "CancelRequested" and len(live) == 1
            assert live[0].cancel_requested_at_ms is not None


# --------------------------------------------------------------------------- delete
def test_delete_removes_the_run_and_leaves_a_tombstone_in_the_feed(store):
    """EC-01: deleting a run (retention, by an operator) removes it and leaves its tombstone: the
    feed reports it deleted, and a snapshot read answers Missing(deleted)."""
    store.runs.create("gone", "{}")
    before = store.feed.position()
    store.runs.delete("gone")
    with pytest.raises(RunStoreError) as err:
        store.runs.get("gone")
    assert err.value.code == "not_found_row"
    changes = store.feed.changes_since(before).changes
    assert [(c.run_id, c.deleted) for c in changes] == [("gone", True)]
    (missing,) = store.feed.read(["gone"]).snapshots
    assert type(missing).__name__ == "Missing" and missing.deleted is True
    (fact,) = _events(store, "gone", DELETED)
    assert fact.payload == {"runId": "gone", "status": "pending", "forced": False}


def test_delete_refuses_a_running_run_unless_forced_and_forcing_releases_the_lease(store, raw):
    activate_new(store, "busy", A)
    with pytest.raises(RunStoreError) as err:
        store.runs.delete("busy")
    assert err.value.code == "refused" and "force" in err.value.detail
    assert store.runs.get("busy").status == "running"
    store.runs.delete("busy", force=True)
    leases = raw.exec_driver_sql("SELECT count(*) FROM flows_consensus_leases WHERE run_id = 'busy'").scalar()
    assert leases == 0
    # The id is free again and a new owner can take it: no lease was left behind.
    store.runs.create("busy", "{}")
    claimed = store.runs.claim("busy", PENDING, B, store.clock.now_ms())
    assert isinstance(claimed, Claimed)
    assert store.runs.activate("busy", B, claimed.claimed_at_ms, PENDING).__class__.__name__ == "Activated"


def test_delete_refuses_a_claimed_run_unless_forced(store):
    store.runs.create("held", "{}")
    assert isinstance(store.runs.claim("held", PENDING, A, store.clock.now_ms()), Claimed)
    with pytest.raises(RunStoreError) as err:
        store.runs.delete("held")
    assert err.value.code == "refused"
    store.runs.delete("held", force=True)
    assert isinstance(store.runs.claim("held", PENDING, B, store.clock.now_ms()), NotFound)


def test_delete_removes_the_runs_attempts_and_refuses_a_parent(store):
    store.runs.create("parent", "{}")
    store.runs.create("child", "{}", parent_run_id="parent")
    with pytest.raises(RunStoreError) as err:
        store.runs.delete("parent")
    assert err.value.code == "refused" and "parent" in err.value.detail
    store.runs.delete("child")
    store.runs.delete("parent")
    with pytest.raises(RunStoreError) as err:
        store.runs.delete("parent")
    assert err.value.code == "not_found_row"


def test_a_run_with_attempts_is_deleted_with_them(store, raw):
    from fencepost import Attempt

    activate_new(store, "stepped", A)
    assert store.attempts.put(Attempt("stepped", "d1", 0, "running", 0), A).__class__.__name__ == "Inserted"
    assert isinstance(store.runs.transition_owned("stepped", A, "completed"), Transitioned)
    store.runs.delete("stepped")
    with pytest.raises(RunStoreError):
        store.runs.get("stepped")
    assert raw.exec_driver_sql("SELECT count(*) FROM flows_attempts WHERE run_id = 'stepped'").scalar() == 0


def test_delete_races_a_claim_and_never_leaves_a_lease_without_its_run(store, raw):
    for round_ in range(10):
        run_id = f"dc-{round_}"
        store.runs.create(run_id, "{}")
        deleted, claimed = _race(lambda rid=run_id: store.runs.delete(rid) or "deleted",
                                 lambda rid=run_id: type(store.runs.claim(rid, PENDING, A, 0)).__name__)
        leases = raw.exec_driver_sql(f"SELECT count(*) FROM flows_consensus_leases WHERE run_id = '{run_id}'").scalar()
        rows = raw.exec_driver_sql(f"SELECT count(*) FROM flows_runs WHERE run_id = '{run_id}'").scalar()
        raw.rollback()
        assert (deleted, claimed, rows) in {("deleted", "NotFound", 0), ("refused", "Claimed", 1)}
        assert leases <= rows


def test_the_noop_store_refuses_the_operator_operations():
    from fencepost import RunStore

    noop = RunStore.noop()
    for call in (lambda: noop.create_many([("r", "{}")]), lambda: noop.retry("r"), lambda: noop.delete("r")):
        with pytest.raises(RunStoreError) as e:
            call()
        assert e.value.code == "persistence_failed"
