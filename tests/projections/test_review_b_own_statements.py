"""A statement of the projection's own code that the target refuses.

Defect (found by a review, SQLite and PostgreSQL): version 2 of a custom projection writes a column
that the table on the target (created by version 1) lacks. ``catch_up`` and ``rebuild`` failed with
a bare "projection target persistence failed" on SQLite, and on PostgreSQL with "a table or column
fencepost needs is missing ...; fencepost migrations status shows what the database records": the
table is the projection's own, and migrations never create it. Now the error says the projection's
own ``apply`` (or ``reset``) statement was refused, names the projection and the driver's code (no
values), says nothing was written, and says what to do about a changed table shape (drop its
tables, live and ``__shadow``, on the target: the builder creates them again and rebuilds), never
pointing at migrations.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Column, MetaData, Table, Text, delete, text

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder


def _projection(columns: list[str]):
    table = Table("evolving", MetaData(), Column("run_id", Text, primary_key=True),
                  *[Column(c, Text) for c in columns])

    class Evolving:
        name = "evolving"
        feed = "runs"
        tables = (table,)

        def reset(self, target) -> None:
            target.conn.execute(delete(target.table("evolving")))

        def apply(self, target, update) -> None:
            t = target.table("evolving")
            values = {c: update.status for c in columns}
            target.conn.execute(target.insert(t).values(run_id=update.run_id, **values)
                                .on_conflict_do_update(index_elements=[t.c.run_id], set_=values))

    return Evolving()


def test_a_statement_of_the_projections_own_apply_refused_is_named_as_the_projections(store, make_db_url):
    target = make_db_url()
    store.runs.create("a", "{}")
    with ProjectionBuilder(store, target, _projection(["status"])) as builder:
        builder.catch_up()
    store.runs.create("b", "{}")
    with ProjectionBuilder(store, target, _projection(["status", "flow"])) as builder:
        for call in (builder.catch_up, builder.rebuild):
            with pytest.raises(ProjectionError) as caught:
                call()
            error = caught.value
            message = str(error)
            assert error.code == "persistence_failed" and error.db_code is not None, message
            assert "projection evolving" in message and "its own apply" in message, message
            assert error.db_code in message and "nothing" in message and "__shadow" in message, message
            assert "migrations" not in message and "fencepost needs" not in message, message
            assert error.transient is False
        status = builder.status()
        assert status.applied_revision == 1  # the refused page was not applied
        with builder.target.connect() as conn:
            conn.execute(text("DROP TABLE evolving"))
            conn.execute(text("DROP TABLE evolving__shadow"))
            conn.commit()
        builder.catch_up()
        assert builder.status().lag == 0
        rows = builder.target.read(lambda conn: conn.execute(text("SELECT run_id, flow FROM evolving")).all())
        assert sorted(r[0] for r in rows) == ["a", "b"]
