"""The builder's bookkeeping on the target refuses integers past 2^53 - 1 in the database itself.

Pitfall "a NUMERIC/BIGINT beyond 2^53 - 1": the held revisions are source revisions, the counters
and stamps reach ``status()`` and the CLI's JSON. A held revision of 2^53 written behind the builder
made every later update of that run "not newer" for ever (rejected, the projection silently stale);
a counter of 2^53 + 2 was reported as is. Each integer column of the four builder tables now has a
CHECK: 2^53 - 1 is stored, 2^53 is refused. Every target backend (SQLite and PostgreSQL).
"""

from __future__ import annotations

import pytest
import sqlalchemy.exc
from sqlalchemy import text

import fencepost
from fencepost.projections import ProjectionBuilder, RunsByStatus

SAFE_MAX = 2**53 - 1
SHADOW = ("shadow_revision", "shadow_applied", "shadow_started_at_ms")


def _set(column: str, value: int) -> str:
    if column in SHADOW:  # the shadow columns are set all together or not at all
        others = {c: 0 for c in SHADOW} | {column: value}
        return ("UPDATE projection_checkpoints SET shadow_source = source, shadow_reason = 'requested', "
                + ", ".join(f"{c} = {v}" for c, v in others.items()))
    return f"UPDATE projection_checkpoints SET {column} = {value}"


STATEMENTS = {
    **{("projection_checkpoints", c): (lambda v, c=c: _set(c, v))
       for c in ("revision", "applied", "rejected", "rebuilds", "updated_at_ms", *SHADOW)},
    **{("projection_rebuilds", c): (lambda v, c=c: f"UPDATE projection_rebuilds SET {c} = {v}")
       for c in ("from_revision", "to_revision", "applied", "started_at_ms", "finished_at_ms")},
    ("projection_run_revisions", "revision"): lambda v: f"UPDATE projection_run_revisions SET revision = {v}",
    ("projection_run_revisions_shadow", "revision"): lambda v: (
        "INSERT INTO projection_run_revisions_shadow (name, run_id, source, revision) "
        f"VALUES ('runs_by_status', 'x', '{'0' * 32}', {v})"),
}


@pytest.fixture
def built(store: fencepost.Store, make_db_url):
    """A target with a checkpoint, held revisions and one finished rebuild; its Database."""
    store.runs.create("a", "{}")
    store.runs.create("b", "{}")
    with ProjectionBuilder(store, make_db_url(), RunsByStatus()) as builder:
        builder.catch_up()
        builder.rebuild()
        yield builder.target


@pytest.mark.parametrize(("table", "column"), sorted(STATEMENTS), ids=lambda v: str(v))
def test_every_builder_integer_column_refuses_2_to_the_53(built, table: str, column: str) -> None:
    statement = STATEMENTS[(table, column)]
    with built.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar() or table.endswith("_shadow")
        conn.exec_driver_sql(statement(SAFE_MAX))  # the largest safe integer is a value like any other
        conn.rollback()
        with pytest.raises(sqlalchemy.exc.IntegrityError):
            conn.exec_driver_sql(statement(SAFE_MAX + 1))
        conn.rollback()


def test_a_held_revision_cannot_be_pushed_past_the_feed_to_silence_a_run(store: fencepost.Store, make_db_url) -> None:
    """The harm the CHECK prevents: after the refused write, the run's next change is still applied."""
    store.runs.create("a", "{}")
    with ProjectionBuilder(store, make_db_url(), RunsByStatus()) as builder:
        builder.catch_up()
        with builder.target.connect() as conn, pytest.raises(sqlalchemy.exc.IntegrityError):
            conn.execute(text("UPDATE projection_run_revisions SET revision = :v"), {"v": SAFE_MAX + 1})
        store.runs.claim_and_own("a", fencepost.RunSnapshot("pending", None, None),
                                 fencepost.OwnerId("h", 1, "n"), 0)
        assert builder.catch_up().applied == 1
        assert builder.target.read(lambda c: c.exec_driver_sql(
            "SELECT status FROM projection_runs_by_status WHERE run_id = 'a'").scalar()) == "running"
