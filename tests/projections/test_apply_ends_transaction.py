"""A projection's ``apply`` that commits (or rolls back, or closes) ``target.conn`` commits nothing.

Defect (found by a review, SQLite and PostgreSQL): ``apply`` calling ``target.conn.commit()``
committed the rows applied so far without the builder's checkpoint (SQLite: the next builder
applied them a second time), or, on PostgreSQL, the rest of the page and its checkpoint although
``catch_up`` failed; every later call of that builder then failed with a bare "projection target
persistence failed". Now the call raises at once, naming it; the page is rolled back whole, the
checkpoint stays where it was, and the same builder goes on once the projection is mended.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Column, MetaData, Table, Text, delete, func, select

from fencepost.projections import ProjectionBuilder

_TABLE = Table("committing", MetaData(), Column("run_id", Text, primary_key=True), Column("status", Text))


class Committing:
    name = "committing"
    feed = "runs"
    tables = (_TABLE,)
    end: str | None = "commit"

    def reset(self, target) -> None:
        target.conn.execute(delete(target.table("committing")))

    def apply(self, target, update) -> None:
        t = target.table("committing")
        target.conn.execute(target.insert(t).values(run_id=update.run_id, status=update.status)
                            .on_conflict_do_update(index_elements=[t.c.run_id], set_={"status": update.status}))
        if self.end is not None and update.run_id == "r1":
            getattr(target.conn, self.end)()


def _rows(builder) -> int:
    with builder.target.connect() as conn:
        return conn.execute(select(func.count()).select_from(_TABLE)).scalar_one()


@pytest.mark.parametrize("end", ["commit", "rollback", "close"])
def test_an_apply_that_ends_the_transaction_commits_nothing_and_the_builder_goes_on(store, make_db_url,
                                                                                    end: str) -> None:
    for i in range(4):
        store.runs.create(f"r{i}", "{}")
    projection = Committing()
    projection.end = end
    with ProjectionBuilder(store, make_db_url(), projection) as builder:
        with pytest.raises(Exception) as caught:
            builder.catch_up()
        assert f"conn.{end}()" in str(caught.value), repr(caught.value)
        assert _rows(builder) == 0
        assert builder.status().applied_revision == 0
        projection.end = None  # mended: the same builder builds every run, once
        builder.catch_up()
        assert _rows(builder) == 4
        assert builder.status().applied_revision == store.feed.position().revision
