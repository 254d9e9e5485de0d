"""Worker processes for test_race.py (module-level so spawned children can import them)."""

from __future__ import annotations

import random
from typing import Any

import fencepost
from fencepost import Activated, LivenessEvidence, OwnerId
from fencepost.clock import ManualClock

ROUND_MS = 31_000  # every round starts with every lease stale


def owner_of(idx: int) -> OwnerId:
    return OwnerId(f"host-{idx % 2}", 1000 + idx, f"worker-{idx}")


def found_and_race(urls: list[str], idx: int, run_ids: list[str], rounds: int, barrier: Any, out: Any) -> None:
    """Open the (possibly fresh) set at once with the others, create a share of the runs, then race
    ``claim_and_own`` on every run every round; report the set id and the (round, run) pairs won."""
    try:
        clock = ManualClock(0)
        me = owner_of(idx)
        rng = random.Random(idx)
        wins = []
        barrier.wait()
        with fencepost.open_shards(urls, clock=clock) as shards:
            for rid in run_ids[idx::4]:
                shards.runs.create(rid, "{}")
            barrier.wait()
            for rnd in range(rounds):
                now = rnd * ROUND_MS
                clock.set(now)
                barrier.wait()
                order = list(run_ids)
                rng.shuffle(order)
                for rid in order:
                    row = shards.runs.get(rid)
                    evidence = LivenessEvidence(row.owner, now, "lease-expired") if row.owner is not None else None
                    if shards.runs.claim_and_own(rid, row, me, now, evidence) == Activated():
                        wins.append((rnd, rid))
                        shards.journal.append(rid, "won", {"round": rnd}, owner=me, source_id=me.nonce,
                                              source_seq=rnd)
                barrier.wait()
            out.put(("ok", idx, shards.membership.set_id, wins))
    except BaseException as exc:  # report to the parent instead of dying silently
        barrier.abort()
        out.put(("error", idx, type(exc).__name__, str(exc)[:300]))
