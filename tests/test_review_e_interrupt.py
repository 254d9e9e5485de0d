"""Defect (found by a review, SQLite and PostgreSQL): a second Ctrl-C in a Python worker host, landing
while ``Worker.run`` waited for the runs in hand to finish (``pool.shutdown(wait=True)``), skipped the
rest of its cleanup: the supervisor went on pulsing after ``run()`` raised, the host then closed the
store, and the runs were left ``running`` (settling them failed on the closed store) until their
leases lapsed.

Now a second interrupt stops the wait: the runs whose functions are still running are given back at
once (parked ``suspended`` from their last checkpoint, claimable by a peer), the supervisor is
stopped, and the interrupt is raised. A function that ends afterwards writes nothing for its run.

The interrupts are injected (the first from ``stop.is_set()``, the second from the pool's shutdown),
so the test does not depend on signal delivery.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

import fencepost.worker as worker_module
from fencepost.worker import RunContext, Worker


class _InterruptedWait(worker_module.ThreadPoolExecutor):
    """A pool whose graceful shutdown is interrupted (Ctrl-C again) while it waits."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if wait:
            super().shutdown(wait=False, cancel_futures=cancel_futures)
            time.sleep(0.2)
            raise KeyboardInterrupt
        super().shutdown(wait=wait, cancel_futures=cancel_futures)


class _CtrlC:
    """A stop signal that raises ``KeyboardInterrupt`` (the first Ctrl-C) once ``armed`` is set."""

    def __init__(self) -> None:
        self.armed = threading.Event()

    def is_set(self) -> bool:
        if self.armed.is_set():
            raise KeyboardInterrupt
        return False


def test_a_second_interrupt_gives_the_runs_in_hand_back_and_stops_supervision(store, monkeypatch, caplog):
    for i in range(2):
        store.runs.create(f"r{i}", '{"v":0}')
    monkeypatch.setattr(worker_module, "ThreadPoolExecutor", _InterruptedWait)
    release = threading.Event()
    started: list[str] = []
    ended: list[str] = []

    def fn(ctx: RunContext):
        started.append(ctx.run_id)
        release.wait(20)  # a function that does not call check() for a while
        ended.append(ctx.run_id)
        return {"v": 1}

    stop = _CtrlC()
    worker = Worker(store, fn, concurrency=2)

    def arm_when_started() -> None:
        end = time.monotonic() + 10
        while len(started) < 2 and time.monotonic() < end:
            time.sleep(0.01)
        stop.armed.set()

    threading.Thread(target=arm_when_started, daemon=True).start()
    caplog.set_level(logging.INFO, logger="fencepost")
    with pytest.raises(KeyboardInterrupt):
        worker.run(stop)
    try:
        rows = [store.runs.get(f"r{i}") for i in range(2)]
        assert [(r.status, r.owner, r.state_json) for r in rows] == [("suspended", None, '{"v":0}')] * 2
        sup = worker.supervisor._thread
        assert sup is None or not sup.is_alive(), "the supervisor still runs after run() raised"
    finally:
        release.set()
    end = time.monotonic() + 10
    while len(ended) < 2 and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.3)  # the functions' ends are handled (nothing is written for them)
    rows = [store.runs.get(f"r{i}") for i in range(2)]
    assert [(r.status, r.state_json) for r in rows] == [("suspended", '{"v":0}')] * 2
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
