"""A projection's tables belong to it alone on its target.

Defect: a second projection declaring a table another projection already keeps on the target (a
second ``RunsByStatus`` given its own name but the default table, or a custom projection reusing a
built-in table name) was accepted. Both builders then wrote one table: the second one's rows
replaced the first one's, its rebuild swapped the first one's rows out, and the first builder went on
reporting lag 0 over rows it never wrote. A projection table named like one of fencepost's own tables
(``flows_runs``, ``projection_checkpoints`` ...) was accepted too and failed later with an unclear
``persistence_failed``, or, with matching columns, wrote into the store's own table.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Column, MetaData, Table, Text, delete, text

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections import _runs


def _seed(store, n: int) -> None:
    store.db.write(lambda conn: [_runs.create(conn, f"run-{i}", i) for i in range(n)])


def _checkpoint_names(builder: ProjectionBuilder) -> list[str]:
    return builder.target.read(lambda conn: conn.execute(text(
        "SELECT name FROM projection_checkpoints ORDER BY name")).scalars().all())


class _Plain:
    """A custom projection with one table of the given name."""

    feed = "runs"

    def __init__(self, name: str, table: str) -> None:
        self.name = name
        self.table = Table(table, MetaData(), Column("run_id", Text, primary_key=True), Column("status", Text))
        self.tables = (self.table,)

    def reset(self, target) -> None:
        target.conn.execute(delete(target.table(self.table.name)))

    def apply(self, target, update) -> None:
        table = target.table(self.table.name)
        target.conn.execute(delete(table).where(table.c.run_id == update.run_id))
        if not getattr(update, "deleted", False):
            target.conn.execute(table.insert().values(run_id=update.run_id, status=update.status.upper()))


@pytest.mark.parametrize("second", ["builtin-renamed", "custom"])
def test_a_table_kept_by_another_projection_on_the_target_is_refused(store, target_url, second):
    _seed(store, 4)
    with ProjectionBuilder(store, target_url, RunsByStatus()) as first:
        first.catch_up()
        before = first.target.read(_runs.projected_rows)
    intruder = (RunsByStatus("second_status") if second == "builtin-renamed"
                else _Plain("my_status", "projection_runs_by_status"))
    with ProjectionBuilder(store, target_url, intruder) as builder:
        for call in (builder.catch_up, builder.rebuild):
            with pytest.raises(ProjectionError) as caught:
                call()
            assert caught.value.code == "invalid_projection"
            assert "projection_runs_by_status" in str(caught.value) and "runs_by_status" in str(caught.value)
        assert _checkpoint_names(builder) == ["runs_by_status"]  # nothing of the intruder's was written
    with ProjectionBuilder(store, target_url, RunsByStatus()) as first:
        assert first.target.read(_runs.projected_rows) == before
        assert first.catch_up().applied == 0 and first.rebuild().applied == 4
        assert first.target.read(_runs.projected_rows) == before


def test_the_owner_of_a_table_keeps_using_it_and_other_tables_stay_free(store, target_url):
    _seed(store, 3)
    with ProjectionBuilder(store, target_url, _Plain("mine", "my_table")) as mine:
        assert mine.catch_up().applied == 3
    with ProjectionBuilder(store, target_url, _Plain("mine", "my_table")) as again:
        assert again.rebuild().applied == 3
    with ProjectionBuilder(store, target_url, _Plain("other", "other_table")) as other:
        assert other.catch_up().applied == 3
    with ProjectionBuilder(store, target_url, _Plain("third", "my_table__shadow")) as third:
        with pytest.raises(ProjectionError) as caught:  # the shadow copy of mine's table
            third.catch_up()
        assert caught.value.code == "invalid_projection" and "my_table__shadow" in str(caught.value)


@pytest.mark.parametrize("table", ["flows_runs", "flows_anything", "projection_checkpoints", "projection_rebuilds",
                                   "projection_run_revisions", "projection_run_revisions_shadow",
                                   "projection_tables", "fencepost_projection_swap"])
def test_a_table_named_like_fencepost_own_tables_is_refused_before_anything_is_written(store, tmp_path, table):
    _seed(store, 2)
    target = tmp_path / "never.db"
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, f"sqlite:///{target}", _Plain("mine", table))
    assert caught.value.code == "invalid_projection" and table in str(caught.value)
    assert not target.exists()
    assert store.db.read(lambda conn: conn.execute(text("SELECT count(*) FROM flows_runs")).scalar()) == 2
