"""Projection names and table declarations the builder refuses when it is made.

Defect (found by a review, SQLite and PostgreSQL): a projection fed by one source whose name holds
``@`` (``combo@edge``) shares the name of the checkpoint of source ``edge`` of a projection ``combo``
fed by several sources: its ``status()`` reported that share's revision and pending rebuild as its
own, and that projection's ``status()['edge']`` reported the other's checkpoint. ``@`` in the name
of a projection fed by one source is now refused when the builder is made (``invalid_projection``),
as the docs promise a name held by the other kind is refused, instead of misreported.

Defect (found by a review, SQLite and PostgreSQL): a table declared with ``schema=`` was accepted,
then failed at the first call with a bare "Projection.prepare: projection target persistence
failed", naming neither the table nor the cause. It is now refused when the builder is made,
naming the table: a projection's tables live in the target's own schema (or SQLite file).
"""

from __future__ import annotations

import pytest
from sqlalchemy import Column, MetaData, Table, Text, delete

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus


def test_a_name_with_at_is_refused_for_a_projection_fed_by_one_source(store, make_db_url):
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, make_db_url(), RunsByStatus(name="combo@edge", table="single_t"))
    message = str(caught.value)
    assert caught.value.code == "invalid_projection"
    assert "'@'" in message and "combo" not in message, message


def test_a_name_with_at_stays_allowed_with_several_sources(store, make_db_url):
    import fencepost

    other = fencepost.open(make_db_url())
    try:
        store.runs.create("e0", "{}")
        other.runs.create("h0", "{}")
        with ProjectionBuilder({"edge": store, "hq": other}, make_db_url(),
                               RunsByStatus(name="team@site", table="combo_t")) as builder:
            assert {k: v.revision for k, v in builder.catch_up().items()} == {"edge": 1, "hq": 1}
    finally:
        other.close()


class _InSchema:
    name = "in_schema"
    feed = "runs"
    tables = (Table("rows7", MetaData(), Column("run_id", Text, primary_key=True), schema="elsewhere"),)

    def reset(self, target) -> None:
        target.conn.execute(delete(target.table("rows7")))

    def apply(self, target, update) -> None:  # pragma: no cover - never reached
        raise AssertionError("refused before any write")


def test_a_table_declared_in_a_schema_is_refused_when_the_builder_is_made(store, make_db_url):
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, make_db_url(), _InSchema())
    assert caught.value.code == "invalid_projection"
    message = str(caught.value)
    assert "'rows7'" in message and "schema" in message and "elsewhere" not in message, message
