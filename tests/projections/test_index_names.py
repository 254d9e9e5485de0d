"""Index names of a projection's tables stay the declared ones whatever the number of rebuilds.

Defect: the rebuild swap exchanged the live and shadow tables' names but not their indexes', so
after an odd number of rebuilds the live table carried ``<index>__shadow`` and the shadow table the
declared index name. Dropping the live table (to have it built again) then made every new builder
fail with ``persistence_failed``: creating the live table's declared index clashed with the
shadow table's. Now the swap (and a builder's start, for a target left that way) gives each table's
indexes back their own names: renamed on PostgreSQL, created again on SQLite.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Column, Index, Integer, MetaData, Table, Text, UniqueConstraint, delete, inspect, text

from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections import _runs

LIVE = "projection_runs_by_status"
SHADOW = f"{LIVE}__shadow"
INDEX = f"{LIVE}_status_idx"


def _seed(store, prefix: str, n: int, t: int = 0) -> None:
    store.db.write(lambda conn: [_runs.create(conn, f"{prefix}-{i}", t + i) for i in range(n)])


def _drop(builder: ProjectionBuilder, table: str) -> None:
    builder.target.write(lambda conn: conn.execute(text(f"DROP TABLE {table}")))


def _index_names(builder: ProjectionBuilder, table: str) -> set[str]:
    def read(conn) -> set[str]:
        found = {i["name"] for i in inspect(conn).get_indexes(table)}
        if conn.dialect.name == "postgresql":  # unique constraints and the primary key are indexes too
            found |= {r[0] for r in conn.execute(text(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = :t"),
                {"t": table})}
        return found

    return builder.target.read(read)


@pytest.mark.parametrize("rebuilds", [1, 2, 3])
def test_index_names_are_the_declared_ones_after_any_number_of_rebuilds(store, target_url, rebuilds):
    _seed(store, "a", 7)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        builder.catch_up()
        live_before, shadow_before = _index_names(builder, LIVE), _index_names(builder, SHADOW)
        assert INDEX in live_before and f"{INDEX}__shadow" in shadow_before
        for _ in range(rebuilds):
            assert builder.rebuild().rebuilt
            assert _index_names(builder, LIVE) == live_before
            assert _index_names(builder, SHADOW) == shadow_before
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)


@pytest.mark.parametrize("rebuilds", [1, 2, 3])
def test_a_live_table_dropped_after_rebuilds_is_built_again(store, target_url, rebuilds):
    _seed(store, "a", 7)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        builder.catch_up()
        for _ in range(rebuilds):
            builder.rebuild()
        _drop(builder, LIVE)
    _seed(store, "b", 2, 100)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        done = builder.catch_up()
        assert done.revision == 9
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)
        assert INDEX in _index_names(builder, LIVE)
        # And it keeps rebuilding afterwards.
        assert builder.rebuild().rebuilt
        assert INDEX in _index_names(builder, LIVE)


def test_a_target_left_with_swapped_index_names_is_healed_at_start(store, target_url):
    """A target whose tables carry each other's index names (swapped by an earlier version)."""
    _seed(store, "a", 5)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        builder.catch_up()

        def swap_names(conn) -> None:
            for sql in (f"DROP INDEX {INDEX}", f"DROP INDEX {INDEX}__shadow",
                        f"CREATE INDEX {INDEX}__shadow ON {LIVE} (status, created_at_ms, run_id)",
                        f"CREATE INDEX {INDEX} ON {SHADOW} (status, created_at_ms, run_id)"):
                conn.exec_driver_sql(sql)

        builder.target.write(swap_names)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        builder.catch_up()
        assert INDEX in _index_names(builder, LIVE)
        assert f"{INDEX}__shadow" in _index_names(builder, SHADOW)
        _drop(builder, LIVE)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        builder.catch_up()
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)


def test_a_swap_interrupted_before_commit_leaves_names_and_rows_as_they_were(store, target_url):
    _seed(store, "a", 6)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        builder.catch_up()
        live_before, shadow_before = _index_names(builder, LIVE), _index_names(builder, SHADOW)
        tables = builder._tables
        original = tables.swap

        def killed(conn, backend, share):
            original(conn, backend, share)
            raise KeyboardInterrupt  # the process dies after the swap's statements, before the commit

        tables.swap = killed
        with pytest.raises(KeyboardInterrupt):
            builder.rebuild()
        assert _index_names(builder, LIVE) == live_before and _index_names(builder, SHADOW) == shadow_before
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        assert builder.catch_up().rebuilt  # the pending rebuild resumes and swaps
        assert _index_names(builder, LIVE) == live_before and _index_names(builder, SHADOW) == shadow_before
        _drop(builder, LIVE)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        builder.catch_up()
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)


class Tagged:
    """A custom projection with an explicit index, a column index, and a named unique constraint."""

    name = "tagged"
    feed = "runs"

    def __init__(self) -> None:
        md = MetaData()
        self.table = Table(
            "tagged_runs", md,
            Column("run_id", Text, primary_key=True),
            Column("status", Text, nullable=False, index=True),
            Column("flow", Text),
            Column("seq", Integer, nullable=False),
            UniqueConstraint("seq", "run_id", name="tagged_runs_seq_uq"),
        )
        Index("tagged_runs_flow_idx", self.table.c.flow, self.table.c.status)
        self.tables = (self.table,)

    def reset(self, target) -> None:
        target.conn.execute(delete(target.table("tagged_runs")))

    def apply(self, target, update) -> None:
        table = target.table("tagged_runs")
        target.conn.execute(delete(table).where(table.c.run_id == update.run_id))
        if hasattr(update, "status"):
            target.conn.execute(table.insert().values(run_id=update.run_id, status=update.status,
                                                      flow=update.flow_name, seq=update.revision))


def test_a_custom_projections_indexes_keep_their_names(store, target_url):
    _seed(store, "a", 5)
    with ProjectionBuilder(store, target_url, Tagged(), batch_size=2) as builder:
        builder.catch_up()
        live_before, shadow_before = _index_names(builder, "tagged_runs"), _index_names(builder, "tagged_runs__shadow")
        assert "tagged_runs_flow_idx" in live_before
        builder.rebuild()
        assert _index_names(builder, "tagged_runs") == live_before
        assert _index_names(builder, "tagged_runs__shadow") == shadow_before
        _drop(builder, "tagged_runs")
    with ProjectionBuilder(store, target_url, Tagged(), batch_size=2) as builder:
        builder.catch_up()
        assert builder.target.read(lambda c: c.execute(text("SELECT COUNT(*) FROM tagged_runs")).scalar()) == 5
        assert _index_names(builder, "tagged_runs") == live_before
        builder.rebuild()
        builder.rebuild()
        builder.rebuild()
        assert _index_names(builder, "tagged_runs") == live_before
        assert _index_names(builder, "tagged_runs__shadow") == shadow_before


def test_a_builder_killed_inside_the_swap_leaves_a_target_the_next_builder_finishes(store, db_url, target_url):
    """SIGKILL (a real process) while the swap transaction holds its renames, uncommitted."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    _seed(store, "a", 8)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "tests.projections._swap_kill_child", db_url, target_url],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "swapping", proc.stderr.read() if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3, lock_timeout=60) as builder:
        assert builder.catch_up().rebuilt  # the interrupted rebuild is finished
        assert INDEX in _index_names(builder, LIVE) and f"{INDEX}__shadow" in _index_names(builder, SHADOW)
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)
        _drop(builder, LIVE)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        builder.catch_up()
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)
