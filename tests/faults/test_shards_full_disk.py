"""A shard set grown while one member's disk is full (a small tmpfs; the other stores are elsewhere).

Covers the pair nothing else did: full disk x shard-set operation (the interrupted-grow tests
write the half-grown records by hand; here a real full disk interrupts the grow). The open fails
as ``ShardError`` ``persistence_failed`` with ``SQLITE_FULL``. A grow records the appended store
first and the first store last (in the transaction that holds it while the others are written), so
the appended store holds the new list and both old members their old records: the old member list
still opens, and once space is back the same ``grow=True`` open finishes it, every run kept.
SQLite only: a PostgreSQL server's disk is the server's own.
"""

from __future__ import annotations

import pytest

import fencepost
from tests.faults.conftest import assert_value_free, shard_records

pytestmark = pytest.mark.slow


def test_a_grow_interrupted_by_a_full_disk_is_refused_then_finished(small_disk, tmp_path) -> None:
    if not small_disk.mounted:
        pytest.skip("needs a tmpfs: the page cap is a hook on one open store, and the grow opens its own")
    urls = [f"sqlite:///{tmp_path / 's0.db'}", small_disk.url("s1.db"), f"sqlite:///{tmp_path / 's2.db'}"]
    ids = [f"run-{i}" for i in range(8)]
    with fencepost.open_shards(urls[:2]) as shards:
        for run_id in ids:
            shards.runs.create(run_id, "{}")
        before = shard_records(urls[:2])
        small_disk.fill(shards["shard-1"])
    try:
        with pytest.raises(fencepost.ShardError) as caught:
            fencepost.open_shards(urls, grow=True).close()
    finally:
        small_disk.free()
    assert (caught.value.code, getattr(caught.value, "db_code", None)) == ("persistence_failed", "SQLITE_FULL")
    assert_value_free(caught.value)
    s0, s1, s2 = shard_records(urls)
    assert [s0, s1] == before  # nothing half-written in the full store; the first store's write rolled back
    assert s2 is not None and (s2.generation, s2.members) == (2, ("shard-0", "shard-1", "shard-2"))
    with fencepost.open_shards(urls[:2]) as shards:  # no old member records the new list yet
        assert shards.membership.generation == 1
    with fencepost.open_shards(urls, grow=True) as shards:
        assert shards.membership.generation == 2
        assert [shards.runs.get(r).status for r in ids] == ["pending"] * len(ids)
        shards.runs.create("after", "{}")
    assert {(r.generation, r.members) for r in shard_records(urls)} == {(2, ("shard-0", "shard-1", "shard-2"))}
