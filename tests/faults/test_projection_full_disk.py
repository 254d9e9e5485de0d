"""A projection rebuild whose SQLite target's disk fills: at the rebuild's first write, in the middle
of the shadow fill, and at the swap (a small tmpfs; the source store is on another disk).

Covers the pair nothing else did: full disk x projection rebuild and its swap. Each failing call is
a ``ProjectionError`` (``persistence_failed``, ``SQLITE_FULL``) with no driver exception in it; the
live table keeps the rows it had (readers never see a partial rebuild); and once space is back the
SAME builder finishes the rebuild (resuming the shadow where one was begun), after which the
projection equals one built afresh on another target and the builder's lock is free.
"""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import text

import fencepost
from fencepost._durable import Database
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.faults.conftest import assert_value_free

pytestmark = pytest.mark.slow

RUNS = 400


def _rows(url: str) -> list[tuple]:
    db = Database(url, readonly=True)
    try:
        return db.read(lambda conn: [tuple(r) for r in conn.execute(text(
            "SELECT run_id, status, flow_name, created_at_ms, source, revision FROM projection_runs_by_status "
            "ORDER BY run_id")).all()])
    finally:
        db.dispose()


@pytest.mark.parametrize("when", ["start", "mid-fill", "swap"])
def test_a_rebuild_on_a_full_disk_leaves_the_live_table_and_the_same_builder_finishes_it(
        small_disk, tmp_path, when: str) -> None:
    if not small_disk.mounted:
        pytest.skip("needs a tmpfs: the page cap is a hook on a store, and the target is no store")
    # SQLite's own checkpoints (no background thread): the log's room is given back only when
    # the test says so.
    target = small_disk.url("projection.db") + "?checkpoints=writer"
    with fencepost.open(f"sqlite:///{tmp_path / 'flows.db'}") as store:
        store.journal.transact(lambda tx: [store.runs.create(f"run-{i:04d}", '{"flowName": "demo"}')
                                           for i in range(RUNS)])
        with ProjectionBuilder(store, target, RunsByStatus(), batch_size=50) as builder:
            assert builder.catch_up().applied == RUNS
            store.runs.create("late", "{}")  # one change the rebuild must also carry
            live = _rows(target)

            def fill_disk() -> None:
                # The log gives back its room first: a full disk, not a log with space left in it
                # for the next write to reuse.
                with sqlite3.connect(small_disk.root / "projection.db") as raw:
                    assert raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # not busy
                small_disk.fill_leaving(0)

            def fill(shadow: bool, page) -> None:
                if shadow and (page.has_more if when == "mid-fill" else not page.has_more):
                    builder._after_page = None
                    fill_disk()

            if when == "start":
                fill_disk()
            else:
                builder._after_page = fill
            try:
                with pytest.raises(ProjectionError) as caught:
                    builder.rebuild()
            finally:
                builder._after_page = None
                small_disk.free()
            assert caught.value.code == "persistence_failed", caught.value
            assert getattr(caught.value, "db_code", None) == "SQLITE_FULL", caught.value
            assert "Projection.rebuild: " in str(caught.value), caught.value  # names what failed
            assert_value_free(caught.value)
            assert _rows(target) == live  # readers still see the whole old projection
            status = builder.status()
            assert status.pending_rebuild == (None if when == "start" else "requested"), status

            done = builder.rebuild() if when == "start" else builder.catch_up()  # the SAME builder
            assert done.rebuilt is True
            assert builder.status().lag == 0 and builder.status().pending_rebuild is None
            assert builder.catch_up().applied == 0  # nothing left over, nothing applied twice
        fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
        with ProjectionBuilder(store, fresh, RunsByStatus()) as other:
            other.catch_up()
        assert _rows(target) == _rows(fresh)
        assert len(_rows(target)) == RUNS + 1
        with ProjectionBuilder(store, target, RunsByStatus()) as again:  # the lock is free (lock_timeout 0)
            assert again.catch_up().applied == 0
