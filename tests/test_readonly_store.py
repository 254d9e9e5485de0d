"""A store opened read-only refuses writes with each store's own error class and writes nothing."""

from __future__ import annotations

import pytest

import fencepost


def test_writes_on_a_readonly_store_raise_the_stores_own_errors(db_url: str) -> None:
    with fencepost.open(db_url) as writable:
        writable.runs.create("r", "{}")
        before = writable.feed.position()
    with fencepost.open(db_url, readonly=True) as ro:
        with pytest.raises(fencepost.RunStoreError) as err:
            ro.runs.create("x", "{}")
        assert err.value.code == "persistence_failed"
        with pytest.raises(fencepost.JournalError):
            ro.journal.append_unfenced("r", "note", {}, source_id="cli")
        assert ro.runs.get("r").status == "pending"
        assert ro.feed.position() == before
