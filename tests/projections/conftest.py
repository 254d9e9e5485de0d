"""Projection fixtures: a target beside the source store, on the same or the other backend."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["same-db", "other-db", "other-backend"])
def target_url(request: pytest.FixtureRequest, backend: str, db_url: str, make_db_url) -> str:
    """Where the projection lives: the source database itself, another database on the same
    backend, or a database on the other backend (SQLite source -> PostgreSQL target and reverse)."""
    if request.param == "same-db":
        return db_url
    if request.param == "other-db":
        return make_db_url()
    return make_db_url("postgresql" if backend == "sqlite" else "sqlite")
