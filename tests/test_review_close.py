"""Review: ``Store.close()`` while other threads are inside transactions.

``Database`` keeps one connection per thread between transactions; ``close()`` releases them.
A connection in the middle of another thread's transaction must not be closed under it: that
left SQLite's write lock held by an orphaned transaction, so every later writer (in any process)
waited on ``BEGIN IMMEDIATE`` for ever.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import fencepost
from fencepost.clock import ManualClock


def test_close_while_threads_write_leaves_the_database_writable(db_url: str) -> None:
    """Writers racing repeated ``close()`` calls never wedge the database; every write lands or fails cleanly."""
    store = fencepost.open(db_url, clock=ManualClock(0))
    stop = threading.Event()
    created: list[str] = []
    failures: list[BaseException] = []

    def work(i: int) -> None:
        k = 0
        while not stop.is_set():
            k += 1
            rid = f"w{i}-{k}"
            try:
                store.runs.create(rid, "{}")
                created.append(rid)
            except fencepost.FencepostError as exc:
                failures.append(exc)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 5
        while len(created) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(5):
            store.close()
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not any(t.is_alive() for t in threads), "a writer is stuck after Store.close()"
    # A fresh store (a new process would be the same) can still take the write lock at once.
    other = fencepost.open(db_url, clock=ManualClock(0))
    try:
        done: list[Any] = []
        t = threading.Thread(target=lambda: done.append(other.runs.create("after-close", "{}")), daemon=True)
        t.start()
        t.join(10)
        assert done, "the database is still write-locked after Store.close()"
        for rid in created[:50]:
            assert other.runs.get(rid).status == "pending"
    finally:
        other.close()
        store.close()
