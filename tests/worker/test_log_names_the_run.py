"""Every line the worker logs about one run names that run in its text.

Defect: three lines named their run only in the record's ``extra`` fields, which the
``fencepost worker`` log format does not print: ``took over a run whose lease expired``,
``run heartbeat write failed`` and ``settling a run failed`` (with a traceback of fencepost's own
frames). Seen by an operator as a full disk (a tmpfs filled) under ``fencepost worker``: a screen
of tracebacks and no way to tell which runs were hit. A settlement that failed on a database error
is now one line naming the run and the failure; a traceback stays for anything else.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

import fencepost
from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Claimed
from fencepost.worker import Worker
from tests.faults.conftest import small_disk  # noqa: F401 - fixture

DEAD = OwnerId("host-gone", 999_999, "dead-owner")


def test_a_takeover_is_logged_with_the_run_id(store, clock, caplog):
    store.runs.create("taken-over-7", "{}")
    row = store.runs.get("taken-over-7")
    claimed = store.runs.claim("taken-over-7", row.snapshot(), DEAD, clock.now_ms())
    assert isinstance(claimed, Claimed)
    store.runs.activate("taken-over-7", DEAD, claimed.claimed_at_ms, row)
    clock.set(30_001)
    with caplog.at_level(logging.INFO, logger="fencepost"):
        assert Worker(store, lambda ctx: {"ok": True}).run(until_idle=True).takeovers == 1
    lines = [r.getMessage() for r in caplog.records if "took" in r.getMessage() and "over" in r.getMessage()]
    assert lines and all("taken-over-7" in line for line in lines), lines


@pytest.mark.slow
def test_a_full_disk_under_a_run_is_logged_naming_the_run_without_a_traceback(small_disk, caplog):  # noqa: F811
    """SQLite only: a full disk is a SQLite fault (PostgreSQL's server owns its disk)."""
    store = fencepost.open(small_disk.url() + "?busy_timeout_ms=2000&checkpoints=writer")
    try:
        store.runs.create("disk-run-3", "{}")
        in_run, filled = threading.Event(), threading.Event()

        def fn(ctx):
            in_run.set()
            assert filled.wait(30)
            ctx.checkpoint({"pad": "x" * 200_000})  # refused by the full disk, not caught here
            return {"done": True}

        worker = Worker(store, fn)
        stop = threading.Event()
        with caplog.at_level(logging.INFO, logger="fencepost"):
            thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
            thread.start()
            assert in_run.wait(30)
            small_disk.fill(store)
            filled.set()
            deadline = time.monotonic() + 20
            while not any(r.levelno >= logging.ERROR for r in caplog.records):
                assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
                time.sleep(0.05)
            small_disk.free()
            stop.set()
            thread.join(30)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        for record in errors:
            text = record.getMessage()
            assert "disk-run-3" in text and "SQLITE_FULL" in text, text
            assert "Traceback" not in text, text
        beats = [r.getMessage() for r in caplog.records if "heartbeat" in r.getMessage()]
        assert all("disk-run-3" in line for line in beats), beats
    finally:
        small_disk.free()
        store.close()
