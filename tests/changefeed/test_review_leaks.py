"""Review: listing errors never echo what the caller passed (filter names included)."""

from __future__ import annotations

import pytest

import fencepost

SECRET = "sk-live-review-0123456789abcdef"


@pytest.mark.parametrize("filters", [
    {SECRET: 1},
    {"status": "pending", SECRET: "x"},
    {"status": SECRET},
    {"flow_name": SECRET + "\x00"},
    {"parent_run_id": [SECRET]},
    {"created_after_ms": SECRET},
])
def test_list_runs_refuses_bad_filters_without_echoing_names_or_values(store: fencepost.Store, filters) -> None:
    """An unknown filter name is input too: the error names the rule, never the name given."""
    with pytest.raises(fencepost.RunStoreError) as info:
        store.feed.list_runs(filters)
    err = info.value
    assert err.code == "invalid_options"
    assert SECRET not in str(err) and SECRET not in repr(err) and SECRET not in repr(getattr(err, "cause", None))
