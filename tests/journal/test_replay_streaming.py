"""``replay_each``: every run's ownership history, one at a time, in memory bounded by the store's
anomalies, not its size.

Defect (scale hunt): ``replay_all`` kept every run's ``OwnershipHistory`` (about 0.9 KB a run) until
the end, and ``journal replay --all`` printed from it, so replaying a million runs held about a
gigabyte even for a one-line summary. ``replay_each`` hands each history to a callback as it is
replayed and keeps only the totals and the histories that break a rule; ``replay_all`` is built
on it and still returns every history, by run id.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

import fencepost
from fencepost.journal import OwnerId, companion_stream

A = OwnerId("host-a", 101, "owner-a")
B = OwnerId("host-a", 202, "owner-b")


def settle(store: fencepost.Store, start: int, n: int) -> None:
    """Runs ``run-<start>`` .. ``run-<start + n - 1>``: claimed, activated and released by A, each
    as the run store writes its facts (in one transaction, to be quick)."""

    def body(conn: Any) -> None:
        for i in range(start, start + n):
            run_id = f"run-{i:05d}"
            for kind, grant in (("claimed", 0), ("activated", 0), ("released", None)):
                store.journal.append_in(conn, companion_stream(run_id), f"flows.consensus.{kind}",
                                        {"runId": run_id, "owner": A.to_json(), "grantedAtMs": grant},
                                        source_id="flows.run-store", meta={"runId": run_id})

    store.db.write(body)


def forge_second_owner(store: fencepost.Store, run_id: str) -> None:
    store.db.write(lambda conn: store.journal.append_in(
        conn, companion_stream(run_id), "flows.consensus.activated",
        {"runId": run_id, "owner": B.to_json(), "grantedAtMs": 5}, source_id="flows.run-store",
        meta={"runId": run_id}))


def peak_bytes(work: Callable[[], object]) -> int:
    """The peak of traced allocations while ``work`` runs (after a warm-up run)."""
    work()  # imports, compiled statements, pools: what any call pays once
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


N = 60


def test_replay_each_holds_memory_independent_of_the_number_of_runs(store: fencepost.Store, monkeypatch) -> None:
    """Replaying 4N runs takes no more memory than replaying N (a clean store; pages of 20 streams)."""
    from fencepost.journal import replay as replay_module
    from fencepost.journal.replay import replay_each

    monkeypatch.setattr(replay_module, "_STREAM_PAGE", 20, raising=False)
    seen: list[int] = []

    def run() -> object:
        seen.clear()
        totals = replay_each(store, lambda h: seen.append(h.facts))
        assert totals.ok and totals.broken == [] and totals.runs == len(seen)
        return totals

    settle(store, 0, N)
    small = peak_bytes(run)
    assert len(seen) == N
    settle(store, N, 3 * N)
    large = peak_bytes(run)
    assert len(seen) == 4 * N
    # Before: ~0.9 KB more for every run replayed (every history kept to the end).
    assert large - small < 100 * 3 * N, (small, large)


def test_replay_all_keeps_every_history_by_run_id_and_replay_each_agrees(store: fencepost.Store) -> None:
    """``replay_all`` is unchanged: every history, by run id, with the totals. ``replay_each``
    hands the same histories over in the order of their companion streams and keeps only the
    broken ones (by run id)."""
    from fencepost.journal.replay import ReplaySummary, ReplayTotals, replay_all, replay_each

    settle(store, 0, 12)
    for run_id in ("run-00003", "run-00007"):
        forge_second_owner(store, run_id)
    summary = replay_all(store)
    assert isinstance(summary, ReplaySummary)
    assert [h.run_id for h in summary.histories] == [f"run-{i:05d}" for i in range(12)]
    handed: list[Any] = []
    totals = replay_each(store, handed.append)
    assert isinstance(totals, ReplayTotals)
    assert [h.stream for h in handed] == sorted(h.stream for h in summary.histories)
    assert sorted(handed, key=lambda h: h.run_id) == summary.histories
    assert (totals.runs, totals.intervals, totals.violations, totals.unattributed_streams) == (
        summary.runs, summary.intervals, summary.violations, summary.unattributed_streams)
    assert totals.broken == [h for h in summary.histories if h.violations]
    assert [h.run_id for h in totals.broken] == ["run-00003", "run-00007"]
    assert not totals.ok and not summary.ok
    assert replay_each(store).runs == 12  # no callback: the totals alone


def test_replay_each_progress_ends_at_the_total_across_pages(store: fencepost.Store, monkeypatch) -> None:
    """The companion streams are listed a page at a time; progress still starts at (0, total) and
    ends with replayed == total."""
    from fencepost.journal import replay as replay_module
    from fencepost.journal.replay import replay_each

    monkeypatch.setattr(replay_module, "_STREAM_PAGE", 4, raising=False)
    settle(store, 0, 10)
    calls: list[tuple[int, int]] = []
    totals = replay_each(store, on_progress=lambda done, total: calls.append((done, total)))
    assert totals.runs == 10 and totals.ok
    assert calls == [(0, 10), *((i, 10) for i in range(1, 11))]
