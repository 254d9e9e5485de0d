"""A target ``Database`` that is already closed.

Defect (found by a review, SQLite and PostgreSQL): a closed ``Database`` given as ``target`` was
accepted, then ``catch_up``, ``status`` and ``rebuilds`` leaked the internal
``fencepost._durable.DbFailure`` (no ``FencepostError``). The docs say ``target`` is a URL or an
open database and anything else is ``invalid_projection``: the builder now refuses it when it is
made, naming the argument; one closed after the builder was made fails its calls with
``ProjectionError`` (``persistence_failed``, ``db_code`` ``closed``), never a bare driver-side error.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus


def test_a_closed_target_database_is_refused_when_the_builder_is_made(store, make_db_url):
    other = fencepost.open(make_db_url())
    other.close()
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, other.db, RunsByStatus())
    assert caught.value.code == "invalid_projection"
    assert "target" in str(caught.value) and "closed" in str(caught.value)


@pytest.mark.parametrize("first", ["catch_up", "status", "rebuilds"])
def test_a_target_database_closed_before_the_first_call_fails_as_a_projection_error(store, make_db_url, first):
    other = fencepost.open(make_db_url())
    store.runs.create("a", "{}")
    builder = ProjectionBuilder(store, other.db, RunsByStatus())
    other.close()
    try:
        for call in (getattr(builder, first), builder.catch_up, builder.status, builder.rebuilds):
            with pytest.raises(ProjectionError) as caught:
                call()
            assert caught.value.db_code == "closed" and caught.value.transient is False
    finally:
        builder.close()
