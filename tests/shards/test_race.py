"""Races as races: four processes through one shard set (3 SQLite files / 3 PostgreSQL schemas).

The processes also found the set at once. Invariants: one set identity; each (round, run) won
exactly once (0 double ownership, replayed from the companion facts); every run, fact and journal
entry on the run's own shard and on no other.
"""

from __future__ import annotations

from collections import Counter

import pytest

import fencepost
from fencepost.journal import companion_stream
from fencepost.shards import membership as ms
from tests.conftest import race_processes

from . import _race_workers as w

PROCS = 4
RUNS = 24
ROUNDS = 4


def _owners_from_facts(entries) -> list[str]:
    """Replay claimed/activated/stolen facts; assert one owner at a time; the activating nonces in order."""
    owner, pending, activations = None, None, []
    for e in entries:
        kind = e.event_type.rsplit(".", 1)[-1]
        who = e.payload.get("owner") or e.payload.get("claimant")
        if kind in ("claimed", "stolen"):
            assert pending is None, "two claims at once"
            pending = who
        elif kind == "activated":
            assert pending is not None, "activation without a claim"
            owner, pending = who, None
            activations.append(owner)
    return activations


@pytest.mark.slow
def test_four_processes_through_a_shard_set_admit_one_owner_per_epoch(shard_urls) -> None:
    urls = shard_urls(3)
    ids = [f"race-{i}" for i in range(RUNS)]
    results, _ = race_processes(w.found_and_race, lambda i: (urls, i, ids, ROUNDS), PROCS, timeout=180)
    assert all(r[0] == "ok" for r in results), results
    assert len({r[2] for r in results}) == 1, "the processes founded more than one set"
    wins = Counter((rnd, rid) for r in results for rnd, rid in r[3])
    winner = {(rnd, rid): w.owner_of(r[1]).nonce for r in results for rnd, rid in r[3]}
    assert all(wins[(rnd, rid)] == 1 for rnd in range(ROUNDS) for rid in ids), wins
    assert sum(wins.values()) == ROUNDS * RUNS
    with fencepost.open_shards(urls) as shards:
        # The founding open marked every member founded, once (no journal entry: the journals hold
        # the runs' entries only, checked below).
        assert all(ms.read_founded(store) is not None for _, store in shards.items())
        homes = {rid: shards.place(rid) for rid in ids}
        assert len(set(homes.values())) == 3
        for name, store in shards.items():
            mine = {rid for rid, home in homes.items() if home == name}
            listed = {r.run_id for r in store.feed.list_runs(limit=200).runs}
            assert listed == mine, name
            streams = {e.run_id for e in store.journal.log()}
            assert streams == mine | {companion_stream(rid) for rid in mine}, name
            for rid in mine:
                activations = _owners_from_facts(store.journal.entries(companion_stream(rid)).entries)
                assert [a["nonce"] for a in activations] == [winner[(rnd, rid)] for rnd in range(ROUNDS)]
                won = [e.payload["round"] for e in store.journal.entries(rid).entries]
                assert won == list(range(ROUNDS))
