"""Worker processes for test_race.py (module-level so spawned children can import them)."""

from __future__ import annotations

from typing import Any

import fencepost
from fencepost.clock import ManualClock
from tests.runstore._race_workers import owner_of, race_rounds, take_over


def found_and_race(urls: list[str], idx: int, run_ids: list[str], rounds: int, barrier: Any, out: Any) -> None:
    """Open the (possibly fresh) set at once with the others, create a share of the runs, then race
    ``claim_and_own`` on every run every round; report the set id and the (round, run) pairs won."""
    try:
        clock = ManualClock(0)
        me = owner_of(idx)
        wins = []
        barrier.wait()
        with fencepost.open_shards(urls, clock=clock) as shards:
            for rid in run_ids[idx::4]:
                shards.runs.create(rid, "{}")
            barrier.wait()
            for rnd, now, order in race_rounds(clock, idx, run_ids, rounds, barrier):
                for rid in order:
                    if take_over(shards.runs, rid, me, now):
                        wins.append((rnd, rid))
                        shards.journal.append(rid, "won", {"round": rnd}, owner=me, source_id=me.nonce,
                                              source_seq=rnd)
                barrier.wait()
            out.put(("ok", idx, shards.membership.set_id, wins))
    except BaseException as exc:  # report to the parent instead of dying silently
        barrier.abort()
        out.put(("error", idx, type(exc).__name__, str(exc)[:300]))
