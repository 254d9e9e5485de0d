"""Review: ``create`` / ``create_many`` refuse what the row decoder would refuse, and name their constraint.

Every refusal names the field, never the value, and leaves the database as it was (no run row, no
journal event, no change-feed revision).
"""

from __future__ import annotations

from typing import Any

import pytest

import fencepost
from fencepost import RunAlreadyExists, RunStoreError
from fencepost.journal import COMPANION_PREFIX, companion_stream

from .conftest import PENDING, A, count, raw_exec, revision

SECRET = "sk-live-review-0123456789abcdef"


def _footprint(store: fencepost.Store) -> tuple[int, int, int]:
    return count(store, "flows_runs"), count(store, "flows_journal_events"), revision(store)


def _settle(store: fencepost.Store, run_id: str) -> None:
    claimed = store.runs.claim(run_id, PENDING, A, store.clock.now_ms())
    assert store.runs.activate(run_id, A, claimed.claimed_at_ms, PENDING).__class__.__name__ == "Activated"
    assert store.runs.transition_owned(run_id, A, "completed").__class__.__name__ == "Transitioned"


def _refused(call: Any, code: str) -> RunStoreError:
    with pytest.raises(RunStoreError) as info:
        call()
    assert info.value.code == code, info.value
    return info.value


# ------------------------------------------------------------------ 1. a run that is its own parent

@pytest.mark.parametrize("lineage", [None, "L"])
def test_create_refuses_a_run_that_is_its_own_parent(store: fencepost.Store, lineage: str | None) -> None:
    """parent_run_id == run_id was stored, and every read of the row then failed to decode."""
    before = _footprint(store)
    rid = SECRET
    err = _refused(lambda: store.runs.create(rid, "{}", parent_run_id=rid, lineage_id=lineage,
                                             round_ordinal=None if lineage is None else 1), "invalid_run")
    assert "parent_run_id" in err.detail and SECRET not in str(err)
    assert err.cause == {"field": "parent_run_id"}  # type: ignore[attr-defined]
    assert _footprint(store) == before
    _refused(lambda: store.runs.get(rid), "not_found_row")
    assert store.feed.list_runs().runs == []


def test_a_refused_self_parent_leaves_the_store_readable_and_deletable(store: fencepost.Store) -> None:
    """The reviewer's sequence: after the refusal the id is free, reads decode and delete works."""
    with pytest.raises(RunStoreError):
        store.runs.create("loop", "{}", parent_run_id="loop")
    store.runs.create("loop", "{}")
    store.runs.create("child", "{}", parent_run_id="loop")
    assert sorted(r.run_id for r in store.feed.list_runs().runs) == ["child", "loop"]
    assert store.runs.get("child").parent_run_id == "loop"
    store.runs.delete("child")
    store.runs.delete("loop", force=True)


def test_create_many_carries_no_parent_so_cannot_name_itself(store: fencepost.Store) -> None:
    """create_many takes (run_id, state_json) pairs only: a third member (a parent) is refused."""
    before = _footprint(store)
    err = _refused(lambda: store.runs.create_many([("ok", "{}"), ("loop", "{}", "loop")]), "invalid_run")
    assert "runs[1]" in err.detail
    assert _footprint(store) == before


# ------------------------------------------------------------------ 2. the companion prefix

@pytest.mark.parametrize("field", ["lineage_id", "parent_run_id"])
def test_create_refuses_the_companion_prefix_in_lineage_and_parent(store: fencepost.Store, field: str) -> None:
    """A reserved-prefix lineage_id made retry mint a reserved run id and journal onto a companion stream."""
    store.runs.create("victim", "{}")
    before = _footprint(store)
    stream = companion_stream("victim")
    kwargs: dict[str, Any] = {"lineage_id": stream, "round_ordinal": 1} if field == "lineage_id" else {
        "parent_run_id": stream}
    err = _refused(lambda: store.runs.create("x", "{}", **kwargs), "invalid_run")
    assert field in err.detail and "reserved companion-stream prefix" in err.detail
    assert err.cause == {"field": field}  # type: ignore[attr-defined]
    assert COMPANION_PREFIX not in str(err) and "victim" not in str(err)
    assert _footprint(store) == before
    _refused(lambda: store.runs.get("x"), "not_found_row")


def test_run_id_refusal_still_names_run_id(store: fencepost.Store) -> None:
    err = _refused(lambda: store.runs.create(companion_stream("victim"), "{}"), "invalid_run")
    assert "run_id uses the reserved companion-stream prefix" in err.detail
    err = _refused(lambda: store.runs.create_many([("a", "{}"), (companion_stream("v"), "{}")]), "invalid_run")
    assert "runs[1].run_id" in err.detail


def test_retry_of_a_stored_companion_lineage_writes_nothing(store: fencepost.Store) -> None:
    """A row written before the create-time check (raw SQL here) must not be retried onto a companion stream."""
    store.runs.create("victim", "{}")
    stream = companion_stream("victim")
    raw_exec(store, "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms, lineage_id, round_ordinal) "
                    f"VALUES ('x', 'completed', '{{}}', 0, '{stream}', 1)")
    before = _footprint(store)
    for kwargs in ({}, {"new_run_id": "fresh"}):
        err = _refused(lambda kw=kwargs: store.runs.retry("x", **kw), "refused")
        assert "lineage_id" in err.detail and COMPANION_PREFIX not in str(err)
    assert _footprint(store) == before
    assert [r.run_id for r in store.runs.lineage("x")] == ["x"]


def test_retry_still_works_for_an_ordinary_lineage(store: fencepost.Store) -> None:
    store.runs.create("x", "{}", lineage_id="L", round_ordinal=1)
    _settle(store, "x")
    row = store.runs.retry("x")
    assert (row.run_id, row.lineage_id, row.round_ordinal, row.parent_run_id) == ("L.retry-2", "L", 2, "x")


# ------------------------------------------------------------------ 3. create_many's argument

@pytest.mark.parametrize("bad", [None, 5, "ab", b"ab"])
def test_create_many_refuses_a_non_iterable_as_invalid_run(store: fencepost.Store, bad: Any) -> None:
    """create_many(None) / (5) raised a bare TypeError; a string is not a list of pairs either."""
    before = _footprint(store)
    err = _refused(lambda: store.runs.create_many(bad), "invalid_run")
    assert "runs must be an iterable" in err.detail
    assert err.cause == {"field": "runs"}  # type: ignore[attr-defined]
    assert _footprint(store) == before


def test_create_many_still_takes_any_iterable_of_pairs(store: fencepost.Store) -> None:
    assert store.runs.create_many(iter([("g1", "{}"), ("g2", "[]")])) == 2
    assert store.runs.create_many(()) == 0
    assert store.runs.get("g2").state_json == "[]"


# ------------------------------------------------------------------ 4. which constraint

def test_a_missing_parent_is_a_constraint_that_says_so(store: fencepost.Store) -> None:
    before = _footprint(store)
    err = _refused(lambda: store.runs.create("n1", "{}", parent_run_id=SECRET), "constraint")
    assert not isinstance(err, RunAlreadyExists)
    assert err.detail == "parent_run_id names no run" and SECRET not in str(err)
    assert err.cause["field"] == "parent_run_id"  # type: ignore[attr-defined]
    assert _footprint(store) == before


def test_a_duplicate_lineage_round_is_a_constraint_that_says_so(store: fencepost.Store) -> None:
    store.runs.create("l1", "{}", lineage_id=SECRET, round_ordinal=3)
    before = _footprint(store)
    err = _refused(lambda: store.runs.create("l2", "{}", lineage_id=SECRET, round_ordinal=3), "constraint")
    assert not isinstance(err, RunAlreadyExists)
    assert err.detail == "lineage_id and round_ordinal: that round of the lineage already exists"
    assert SECRET not in str(err) and "3" not in err.detail
    assert err.cause["field"] == "lineage_id"  # type: ignore[attr-defined]
    assert _footprint(store) == before
    store.runs.create("l2", "{}", lineage_id=SECRET, round_ordinal=4)  # another round is fine


def test_a_duplicate_id_is_still_run_already_exists_before_the_other_constraints(store: fencepost.Store) -> None:
    store.runs.create("r", "{}", lineage_id="L", round_ordinal=0)
    err = _refused(lambda: store.runs.create("r", "{}", parent_run_id="nope", lineage_id="L", round_ordinal=0),
                   "constraint")
    assert isinstance(err, RunAlreadyExists)


def test_a_constraint_that_races_past_the_checks_is_still_named(store: fencepost.Store,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """If the in-transaction look-ups miss (a writer outside fencepost), the re-read after the rollback names it."""
    from fencepost.runstore import store as store_mod

    store.runs.create("l1", "{}", lineage_id="L", round_ordinal=0)
    real = store_mod._taken
    calls: list[int] = []

    def first_look_misses(*args: Any) -> Any:  # the in-transaction look-up misses, the re-read does not
        calls.append(1)
        return None if len(calls) % 2 == 1 else real(*args)

    monkeypatch.setattr(store_mod, "_taken", first_look_misses)
    before = _footprint(store)
    err = _refused(lambda: store.runs.create("n1", "{}", parent_run_id="nope"), "constraint")
    assert err.detail == "parent_run_id names no run"
    err = _refused(lambda: store.runs.create("l2", "{}", lineage_id="L", round_ordinal=0), "constraint")
    assert err.detail == "lineage_id and round_ordinal: that round of the lineage already exists"
    assert _footprint(store) == before
