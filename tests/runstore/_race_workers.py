"""Worker processes for test_race.py (module-level so 'spawn' children can import them)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import fencepost
from fencepost import Activated, Claimed, LivenessEvidence, OwnerId
from fencepost.clock import ManualClock

ROUND_MS = 31_000  # every round starts with every lease stale


def owner_of(idx: int) -> OwnerId:
    return OwnerId(f"host-{idx % 2}", 1000 + idx, f"worker-{idx}")


def race_rounds(clock: ManualClock, idx: int, run_ids: list[str], rounds: int, barrier: Any) -> Iterator[tuple]:
    """Each round: set ``clock`` to the round's start, pass ``barrier`` with the others, yield
    ``(round, now, run ids)``, the ids in this worker's own shuffled order."""
    rng = random.Random(idx)
    for rnd in range(rounds):
        now = rnd * ROUND_MS
        clock.set(now)
        barrier.wait()
        order = list(run_ids)
        rng.shuffle(order)
        yield rnd, now, order


def take_over(runs: Any, rid: str, me: OwnerId, now: int) -> bool:
    """``claim_and_own`` of ``rid`` as it stands (evidence of a stale lease if it has an owner): won?"""
    row = runs.get(rid)
    evidence = LivenessEvidence(row.owner, now, "lease-expired") if row.owner is not None else None
    return runs.claim_and_own(rid, row, me, now, evidence) == Activated()


def claim_and_own_worker(url: str, idx: int, run_ids: list[str], rounds: int, barrier: Any, out: Any) -> None:
    """Race claim_and_own on every run, every round; report the (round, run) pairs this worker won."""
    clock = ManualClock(0)
    me = owner_of(idx)
    wins = []
    with fencepost.open(url, clock=clock) as store:
        for rnd, now, order in race_rounds(clock, idx, run_ids, rounds, barrier):
            for rid in order:
                if take_over(store.runs, rid, me, now):
                    wins.append((rnd, rid))
            barrier.wait()
    out.put((idx, wins))


def claim_activate_worker(url: str, idx: int, run_ids: list[str], rounds: int, barrier: Any, out: Any) -> None:
    """Race claim + activate on parked runs; the winner parks its run again after the round."""
    clock = ManualClock(0)
    me = owner_of(idx)
    wins, claims = [], 0
    with fencepost.open(url, clock=clock) as store:
        for rnd, now, order in race_rounds(clock, idx, run_ids, rounds, barrier):
            mine = []
            for rid in order:
                row = store.runs.get(rid)
                claimed = store.runs.claim(rid, row, me, now)
                if isinstance(claimed, Claimed):
                    claims += 1
                    if store.runs.activate(rid, me, claimed.claimed_at_ms, row) == Activated():
                        wins.append((rnd, rid))
                        mine.append(rid)
                    else:
                        store.runs.abandon_claim(rid, me, claimed.claimed_at_ms)
            barrier.wait()
            for rid in mine:
                store.runs.transition_owned(rid, me, "suspended")
            barrier.wait()
    out.put((idx, wins, claims))
