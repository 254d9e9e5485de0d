"""A background checkpoint on a real full disk: the write it could not copy stays durable."""

from __future__ import annotations

import sqlite3

import pytest

import fencepost
from fencepost import _checkpoint
from tests.conftest import eventually
from tests.runstore.test_metrics import value
from tests.test_checkpoint import in_database_file

from .conftest import BIG_STATE


def test_a_checkpoint_that_meets_a_full_disk_leaves_the_write_durable_and_resumes(
        small_disk, monkeypatch, otel) -> None:
    """A real full disk (tmpfs): the committed write stays readable from the log, the store keeps
    working, and once space is back the next checkpoint copies everything."""
    if not small_disk.mounted:
        pytest.skip("needs a real small filesystem (root and mount)")
    monkeypatch.setattr(_checkpoint, "INTERVAL_S", 0.3)
    path = small_disk.root / "flows.db"
    with fencepost.open(f"sqlite:///{path}") as store:
        checkpointer = store.db.backend.checkpointer
        # Grow the log (its file keeps its size once written), let it be copied and start over.
        for i in range(8):
            store.runs.create(f"big-{i}", BIG_STATE)
        assert eventually(lambda: in_database_file(path, "big-7"))
        store.runs.create("restart", '{"n": 1}')  # the first write after a full copy starts the log over
        assert eventually(lambda: in_database_file(path, "restart"))
        # Fill the disk: the log's file has room, the database file cannot grow.
        small_disk.fill(store, keep_log=True)
        failures = checkpointer.failures
        failed = value(otel, "flows_sqlite_checkpoints", outcome="failed")
        store.runs.create("on-full-disk", BIG_STATE)  # new pages: copying it needs space
        assert eventually(lambda: checkpointer.failures > failures)
        assert value(otel, "flows_sqlite_checkpoints", outcome="failed") > failed  # what an operator sees
        # Committed: read back through the log, by the store and by a connection of its own. (The
        # file alone is not consistent after a checkpoint that stopped half way: the log completes it.)
        assert store.runs.get("on-full-disk") is not None
        with sqlite3.connect(path) as other:
            assert other.execute("SELECT count(*) FROM flows_runs WHERE run_id = 'on-full-disk'").fetchone()[0] == 1
        store.runs.create("still-writes", '{"n": 1}')  # the log's file still has room: writes go on
        small_disk.free()
        done = value(otel, "flows_sqlite_checkpoints", outcome="done")
        store.runs.create("after", '{"n": 1}')
        assert eventually(lambda: in_database_file(path, "after"))
        assert in_database_file(path, "on-full-disk") and in_database_file(path, "still-writes")
        assert checkpointer.running and value(otel, "flows_sqlite_checkpoints", outcome="done") > done
