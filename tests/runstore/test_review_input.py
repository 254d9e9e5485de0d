"""Review: malformed arguments are refused as ``invalid_run`` before anything is written."""

from __future__ import annotations

import pytest

import fencepost

from .conftest import A, activate_new

SECRET = "sk-live-review-0123456789abcdef"


@pytest.mark.parametrize("guard", [{"cancel_requested": [SECRET]}, {"cancel_requested": {SECRET: 1}}])
def test_transition_owned_refuses_an_unhashable_guard_value_as_invalid_run(store: fencepost.Store, guard) -> None:
    """A guard value that is not a string is invalid_run (it was a bare TypeError), and nothing moves."""
    activate_new(store, "r", A)
    with pytest.raises(fencepost.RunStoreError) as info:
        store.runs.transition_owned("r", A, "completed", None, guard)
    assert info.value.code == "invalid_run" and SECRET not in str(info.value)
    assert store.runs.get("r").status == "running"


@pytest.mark.parametrize("bad", [[SECRET], {SECRET: 1}])
def test_heartbeat_many_refuses_an_unhashable_run_id_as_invalid_run(store: fencepost.Store, bad) -> None:
    """One unhashable id refuses the whole batch as invalid_run (it was a bare TypeError), nothing renewed."""
    activate_new(store, "r", A)
    store.clock.advance(5_000)
    with pytest.raises(fencepost.RunStoreError) as info:
        store.runs.heartbeat_many(A, ["r", bad], 5_000)
    assert info.value.code == "invalid_run" and SECRET not in str(info.value)
    assert store.runs.get("r").heartbeat_at_ms == 0
