"""Rendezvous placement: stable, spread, and growing a set moves only the new shard's share."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fencepost.shards import place

IDS = [f"run-{i}" for i in range(4000)]


def test_placement_is_stable_across_processes() -> None:
    """The hash is keyed by names only: another interpreter (other hash seed) places ids the same way."""
    names = ["shard-0", "shard-1", "shard-2"]
    here = [place(rid, names) for rid in IDS[:200]]
    code = ("from fencepost.shards import place; import json; "
            f"print(json.dumps([place(f'run-{{i}}', {names!r}) for i in range(200)]))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345"})
    assert other.stdout.strip() == str(here).replace("'", '"')


def test_placement_spreads_ids_evenly() -> None:
    names = [f"shard-{i}" for i in range(4)]
    counts = {n: 0 for n in names}
    for rid in IDS:
        counts[place(rid, names)] += 1
    assert all(800 < c < 1200 for c in counts.values()), counts


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_adding_a_shard_moves_only_ids_to_the_new_shard(n: int) -> None:
    """Going from n to n+1 shards: an id either stays or moves to the new shard, ~1/(n+1) of them."""
    before = [f"shard-{i}" for i in range(n)]
    after = [*before, f"shard-{n}"]
    moved = 0
    for rid in IDS:
        a, b = place(rid, before), place(rid, after)
        if a != b:
            assert b == f"shard-{n}"
            moved += 1
    share = moved / len(IDS)
    assert abs(share - 1 / (n + 1)) < 0.04, share


def test_member_order_does_not_change_placement() -> None:
    names = ["a", "b", "c"]
    assert all(place(rid, names) == place(rid, list(reversed(names))) for rid in IDS[:500])


def test_an_empty_set_is_refused() -> None:
    with pytest.raises(ValueError):
        place("run-1", [])
