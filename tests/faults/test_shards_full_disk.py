"""A shard set grown while one member's disk is full (a small tmpfs; the other stores are elsewhere).

Covers the pair nothing else did: full disk x shard-set operation (the interrupted-grow tests
write the half-grown records by hand; here a real full disk interrupts the grow). The open fails
as ``ShardError`` ``persistence_failed`` with ``SQLITE_FULL``, leaving the members before the full
one at the new generation and the rest untouched; the old member list is then refused naming the
interrupted grow, and once space is back the same ``grow=True`` open finishes it, every run kept.
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
    assert (s0.generation, s0.members) == (2, ("shard-0", "shard-1", "shard-2"))
    assert s1 == before[1] and s2 is None  # nothing half-written in the full store, nothing past it
    with pytest.raises(fencepost.ShardError) as refused:
        fencepost.open_shards(urls[:2]).close()
    assert refused.value.code == "membership_mismatch" and "grow=True" in str(refused.value)
    with fencepost.open_shards(urls, grow=True) as shards:
        assert shards.membership.generation == 2
        assert [shards.runs.get(r).status for r in ids] == ["pending"] * len(ids)
        shards.runs.create("after", "{}")
    assert {(r.generation, r.members) for r in shard_records(urls)} == {(2, ("shard-0", "shard-1", "shard-2"))}
