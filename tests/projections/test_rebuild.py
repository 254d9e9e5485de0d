"""Source rotation and restores: the builder rebuilds into a shadow copy and swaps it in atomically."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

import fencepost
from fencepost.clock import ManualClock
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections import _runs


def _seed(store, ids: list[str], t: int = 0) -> None:
    def body(conn):
        for i, run_id in enumerate(ids):
            _runs.create(conn, run_id, t + i)

    store.db.write(body)


def _sources(builder: ProjectionBuilder, table: str = "projection_runs_by_status") -> set[str]:
    return {r[0] for r in builder.target.read(lambda conn: conn.execute(text(f"SELECT DISTINCT source FROM {table}")))}


def test_rotate_source_makes_the_next_catch_up_rebuild(store, target_url):
    _seed(store, [f"a-{i}" for i in range(40)])
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=16) as builder:
        builder.catch_up()
        old = builder.status()
        store.db.write(lambda conn: _runs.delete(conn, "a-0"))
        rotated = store.feed.rotate_source()
        _seed(store, [f"b-{i}" for i in range(7)], 100)
        assert builder.status().pending_rebuild == "source_changed"

        result = builder.catch_up()
        assert result.rebuilt
        assert result.applied == 47  # 46 live runs and one tombstone, all from revision 0
        rows = builder.target.read(_runs.projected_rows_fn("projection_runs_by_status"))
        assert rows == store.db.read(_runs.live_rows)
        assert _sources(builder) == {rotated.source}
        status = builder.status()
        assert (status.source, status.lag, status.rebuilds, status.pending_rebuild) == (rotated.source, 0, 1, None)
        record = status.last_rebuild
        assert record is not None
        assert (record.reason, record.from_source, record.from_revision) == ("source_changed", old.source,
                                                                            old.applied_revision)
        assert (record.to_source, record.to_revision) == (rotated.source, result.revision)
        assert builder.rebuilds() == [record]
        assert builder.catch_up().rebuilt is False


def test_explicit_rebuild_is_recorded_as_requested(store, target_url):
    _seed(store, [f"r-{i}" for i in range(9)])
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        builder.catch_up()
        result = builder.rebuild()
        assert result.rebuilt and result.applied == 9
        assert builder.status().last_rebuild.reason == "requested"
        assert builder.target.read(_runs.projected_rows_fn("projection_runs_by_status")) == store.db.read(
            _runs.live_rows)


def test_readers_see_the_old_projection_until_the_swap(store, target_url):
    _seed(store, [f"old-{i}" for i in range(30)])
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=10) as builder:
        builder.catch_up()
        before = builder.target.read(_runs.projected_rows_fn("projection_runs_by_status"))
        old_source = builder.status().source
        store.feed.rotate_source()
        _seed(store, [f"new-{i}" for i in range(25)], 100)

        paused, resume = threading.Event(), threading.Event()
        shadow_pages = []

        def hook(shadow: bool, page) -> None:
            if shadow:
                shadow_pages.append(page.next_revision)
                if len(shadow_pages) == 2:
                    paused.set()
                    assert resume.wait(30)

        builder._after_page = hook
        worker = threading.Thread(target=builder.catch_up)
        worker.start()
        try:
            assert paused.wait(30)
            # Mid-rebuild: the shadow holds two committed pages, the live table is untouched.
            assert builder.target.read(_runs.projected_rows_fn("projection_runs_by_status")) == before
            assert _sources(builder) == {old_source}
            half = builder.target.read(lambda conn: conn.execute(
                text("SELECT COUNT(*) FROM projection_runs_by_status__shadow")).scalar())
            assert half == 20
            status = builder.status()
            assert status.pending_rebuild == "source_changed" and status.source == old_source
        finally:
            resume.set()
            worker.join(30)
        after = builder.target.read(_runs.projected_rows_fn("projection_runs_by_status"))
        assert after == store.db.read(_runs.live_rows) and len(after) == 55
        assert _sources(builder) == {store.feed.position().source}
        assert builder.target.read(lambda conn: conn.execute(
            text("SELECT COUNT(*) FROM projection_runs_by_status__shadow")).scalar()) == 0


def test_rebuild_interrupted_mid_shadow_resumes_without_reapplying(store, target_url):
    _seed(store, [f"x-{i}" for i in range(40)])
    builder = ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=10)
    builder.catch_up()
    store.feed.rotate_source()

    class Crash(Exception):
        pass

    def hook(shadow: bool, page) -> None:
        if shadow and page.next_revision >= 20:
            raise Crash()

    builder._after_page = hook
    with pytest.raises(Crash):
        builder.catch_up()
    builder.close()
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=10) as again:
        status = again.status()
        assert status.pending_rebuild == "source_changed"
        result = again.catch_up()
        # Only the pages after the interrupted shadow checkpoint are applied now.
        assert result.rebuilt and result.applied == 20 and result.rejected == 0
        assert again.status().last_rebuild.applied == 40
        assert len(again.rebuilds()) == 1
        assert again.target.read(_runs.projected_rows_fn("projection_runs_by_status")) == store.db.read(
            _runs.live_rows)


def _backup(src: Path, dest: Path) -> None:
    with sqlite3.connect(src) as live, sqlite3.connect(dest) as copy:
        live.backup(copy)
    live.close()
    copy.close()


def _restore(backup: Path, src: Path) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{src}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(backup, src)


def test_restored_older_copy_of_a_sqlite_source_is_detected_and_rebuilt(tmp_path, backend, make_db_url):
    """Same source id, lower revision: a rewind (PITFALLS "Restores rewind the source"). The target
    is SQLite or PostgreSQL (``backend``); the source is a SQLite file."""
    src = tmp_path / "source.db"
    url = f"sqlite:///{src}"
    target_url = make_db_url()
    store = fencepost.open(url, clock=ManualClock(0))
    _seed(store, [f"kept-{i}" for i in range(20)])
    _backup(src, tmp_path / "backup.db")
    backed_up = store.feed.position()
    _seed(store, [f"lost-{i}" for i in range(15)], 50)
    store.db.write(lambda conn: _runs.settle(conn, "kept-3", "failed", 99))
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        builder.catch_up()
        ahead = builder.status().applied_revision
    store.close()

    _restore(tmp_path / "backup.db", src)
    store = fencepost.open(url, clock=ManualClock(0))
    try:
        assert store.feed.position() == backed_up
        with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
            assert builder.status().pending_rebuild == "source_rewound"
            result = builder.catch_up()
            assert result.rebuilt and result.revision == backed_up.revision
            record = builder.status().last_rebuild
            assert (record.reason, record.from_revision, record.to_revision) == (
                "source_rewound", ahead, backed_up.revision)
            rows = builder.target.read(_runs.projected_rows_fn("projection_runs_by_status"))
            assert rows == store.db.read(_runs.live_rows)
            assert not any(run_id.startswith("lost-") for run_id in rows)
            assert rows["kept-3"][0] == "pending"
    finally:
        store.close()
