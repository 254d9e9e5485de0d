"""Races as races: four real processes against one SQLite file / one PostgreSQL schema.

Invariant: each run is activated exactly once per ownership epoch (round), no two owners ever hold
a run, and the companion-stream facts agree with the rows.
"""

from __future__ import annotations

from collections import Counter

import fencepost
from fencepost.clock import ManualClock
from tests.conftest import race_processes

from . import _race_workers as w
from .conftest import facts

PROCS = 4
RUNS = 10
ROUNDS = 5


def _race(db_url, target):
    """RUNS new runs, raced by PROCS processes of ``target``: the run ids and what each process reported."""
    ids = [f"run-{i}" for i in range(RUNS)]
    with fencepost.open(db_url, clock=ManualClock(0)) as store:
        for rid in ids:
            store.runs.create(rid, "{}")
    # fork: the parent holds no open store while children run
    results, exit_codes = race_processes(target, lambda i: (db_url, i, ids, ROUNDS), PROCS, start_method="fork")
    assert exit_codes == [0] * PROCS
    return ids, results


def _tally(reports):
    """How often each (round, run) was won, and by whom, from ``(worker index, pairs won)`` reports."""
    wins = Counter()
    winner = {}
    for idx, won in reports:
        for key in won:
            wins[key] += 1
            winner[key] = w.owner_of(idx)
    return wins, winner


def _replay(events):
    """Walk a run's facts; assert single ownership; return the owners in activation order."""
    owner, pending, activations = None, None, []
    for kind, who, granted in events:
        if kind in ("claimed", "stolen"):
            assert pending is None, "two claims at once"
            assert kind == "stolen" or owner is None, "claimed while owned"
            pending = (who, granted)
        elif kind == "activated":
            assert pending == (who, granted), "activation without its claim"
            owner, pending = who, None
            activations.append(who)
        elif kind == "released":
            if granted is None:
                assert who == owner, "release by a non-owner"
                owner = None
            else:
                assert pending == (who, granted)
                pending = None
        elif kind == "expired":
            assert pending == (who, granted)
            pending = None
    return activations


def test_processes_racing_claim_and_own_admit_one_owner_per_epoch(db_url):
    ids, results = _race(db_url, w.claim_and_own_worker)
    wins, winner = _tally(results)
    assert all(wins[(rnd, rid)] == 1 for rnd in range(ROUNDS) for rid in ids), wins
    assert sum(wins.values()) == ROUNDS * RUNS
    with fencepost.open(db_url, clock=ManualClock(0)) as store:
        for rid in ids:
            owners = _replay(facts(store, rid))
            assert owners == [winner[(rnd, rid)] for rnd in range(ROUNDS)]
            row = store.runs.get(rid)
            assert row.status == "running" and row.owner == owners[-1]
            assert row.heartbeat_at_ms == (ROUNDS - 1) * w.ROUND_MS and row.claimant is None


def test_processes_racing_claim_then_activate_admit_one_owner_per_epoch(db_url):
    ids, results = _race(db_url, w.claim_activate_worker)
    wins, winner = _tally((idx, won) for idx, won, _ in results)
    claims = sum(n for _, _, n in results)
    assert all(wins[(rnd, rid)] == 1 for rnd in range(ROUNDS) for rid in ids), wins
    assert claims == ROUNDS * RUNS  # a granted claim was never lost between claim and activate
    with fencepost.open(db_url, clock=ManualClock(0)) as store:
        for rid in ids:
            events = facts(store, rid)
            assert [e[0] for e in events] == ["claimed", "activated", "released"] * ROUNDS
            assert _replay(events) == [winner[(rnd, rid)] for rnd in range(ROUNDS)]
            row = store.runs.get(rid)
            assert (row.status, row.owner, row.claimant) == ("suspended", None, None)
