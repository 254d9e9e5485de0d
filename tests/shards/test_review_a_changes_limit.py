"""Defect (found by a review, SQLite and PostgreSQL): ``ShardSet.changes(limit=...)`` checked
``limit`` only when the iterator was first advanced, and then with the error of a call the caller
never made (``RunStoreError decode_failed: RunStore.changes_since: limit ...``), while ``positions``
is checked at the call. Now a bad ``limit`` is refused at the call too, as ``positions`` is
(``ShardError invalid_shards`` naming ``limit`` and its range, never the value)."""

from __future__ import annotations

import pytest

import fencepost
from fencepost.shards import ShardError


@pytest.fixture
def shards(shard_urls):
    s = fencepost.open_shards(shard_urls(2))
    yield s
    s.close()


@pytest.mark.parametrize("limit", [-1, 0, 1001, 2**70, "5", 5.0, True, None], ids=repr)
def test_a_bad_limit_is_refused_at_the_call(shards, limit) -> None:
    with pytest.raises(ShardError) as err:
        shards.changes(limit=limit)  # not iterated: refused at the call
    assert err.value.code == "invalid_shards" and err.value.method == "changes", err.value
    assert "limit must be an integer in 1..1000" in str(err.value)


@pytest.mark.parametrize("limit", [1, 1000])
def test_a_limit_in_range_pages_every_change(shards, limit) -> None:
    for i in range(3):
        shards.runs.create(f"c-{i}", "{}")
    assert sorted(c.change.run_id for c in shards.changes(limit=limit)) == ["c-0", "c-1", "c-2"]
