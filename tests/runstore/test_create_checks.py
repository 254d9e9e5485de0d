"""Review: ``create`` / ``create_many`` refuse what the row decoder would refuse, and name their constraint.

Every refusal names the field, never the value, and leaves the database as it was (no run row, no
journal event, no change-feed revision).
"""

from __future__ import annotations

from typing import Any

import pytest

import fencepost
from fencepost import RunStoreError

from .conftest import PENDING, A, count, revision

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
