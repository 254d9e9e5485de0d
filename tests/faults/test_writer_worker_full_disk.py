"""A worker under a 3-second full disk keeps its leases and settles every run exactly once.

Real time, real disk: the worker's heartbeats (one per second) fail while the tmpfs is full, then
renew the same leases once the ballast is gone; no run is lost, retaken or settled twice.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import fencepost
from fencepost.worker import Worker
from tests.faults.conftest import record

pytestmark = pytest.mark.slow


def test_worker_keeps_its_leases_through_a_three_second_full_disk(small_disk) -> None:
    # A short busy timeout keeps a lock wrongly left held from stalling the test for minutes.
    # SQLite's own checkpoints: copied in the background, the log starts over so often that the
    # heartbeats can keep reusing the room a write took just before the disk filled, and never
    # meet the full disk this test is about (tests/test_checkpoint.py covers background copies).
    store = fencepost.open(small_disk.url() + "?busy_timeout_ms=2000&checkpoints=writer")
    try:
        runs = [f"job-{n}" for n in range(6)]
        for run_id in runs:
            store.runs.create(run_id, "{}")
        calls: Counter[str] = Counter()
        refused: Counter[str | None] = Counter()
        in_hand = threading.Semaphore(0)
        landed: list[float] = []

        def fn(ctx):
            calls[ctx.run_id] += 1
            in_hand.release()
            end = time.monotonic() + 5.5  # spans the outage: heartbeats must carry the lease across it
            n = 0
            while time.monotonic() < end:
                ctx.check()  # raises LeaseLost if the lease lapsed
                try:  # a function that checkpoints through the outage, retrying what the disk refused
                    ctx.checkpoint({"n": n + 1})
                    n += 1
                    landed.append(time.monotonic())
                except fencepost.RunStoreError as exc:
                    assert exc.code == "persistence_failed"
                    refused[exc.db_code] += 1  # type: ignore[attr-defined]
                time.sleep(0.2)
            return {"done": ctx.run_id, "checkpoints": n}

        worker = Worker(store, fn, concurrency=3)
        result: list = []
        thread = threading.Thread(target=lambda: result.append(worker.run(until_idle=True)))
        thread.start()
        for _ in range(3):
            assert in_hand.acquire(timeout=60)
        small_disk.fill(store)
        time.sleep(3)
        small_disk.free()
        freed = time.monotonic()
        failed_during = worker.supervisor.failed_pulses
        sent_at_free = worker.supervisor.pulses
        thread.join(timeout=120)
        assert not thread.is_alive()
        first_after = min(t for t in landed if t >= freed)  # the first checkpoint after the space returned
        record("worker under a 3 s full disk", "sqlite", f"checkpoints refused {dict(refused)}; "
               f"{failed_during} heartbeats failed; {result[0]}", first_after - freed)

        stats = result[0]
        assert failed_during > 0, "the disk never filled under the heartbeats"
        assert (stats.completed, stats.failed, stats.lost, stats.takeovers) == (6, 0, 0, 0), stats
        assert calls == Counter({run_id: 1 for run_id in runs})
        assert refused and set(refused) == {"SQLITE_FULL"}, refused  # the run threads hit the disk too
        for run_id in runs:
            row = store.runs.get(run_id)
            assert row.status == "completed" and row.state_json.startswith(f'{{"done":"{run_id}"')
        # Heartbeats resumed once the disk came back, and none failed after it.
        assert worker.supervisor.pulses > sent_at_free
        assert worker.supervisor.failed_pulses <= failed_during + 1  # one may have been in flight
    finally:
        small_disk.free()
        store.close()
