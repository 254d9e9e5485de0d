"""Projection fixtures: a target beside the source store, on the same or the other backend."""

from __future__ import annotations

import pytest

from tests.projections._several import open_sources


@pytest.fixture(params=["same-db", "other-db", "other-backend"])
def target_url(request: pytest.FixtureRequest, backend: str, db_url: str, make_db_url) -> str:
    """Where the projection lives: the source database itself, another database on the same
    backend, or a database on the other backend (SQLite source -> PostgreSQL target and reverse)."""
    if request.param == "same-db":
        return db_url
    if request.param == "other-db":
        return make_db_url()
    return make_db_url("postgresql" if backend == "sqlite" else "sqlite")


@pytest.fixture
def sources(make_db_url):
    """Three fresh stores named as in ``_several.KINDS`` (SQLite and PostgreSQL), closed after the test."""
    _urls, stores = open_sources(make_db_url)
    yield stores
    for store in stores.values():
        store.close()
