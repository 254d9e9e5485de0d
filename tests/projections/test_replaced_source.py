"""A following builder whose source database is replaced at the same URL.

Defect: on SQLite the store's connections keep the deleted (or moved-over) file open, so a builder
in ``run()`` went on reading the old file for ever: ``status()`` said lag 0 against the old source
while the new database at the path had other runs. The builder's watcher saw the follower's "file
replaced" error and treated it as a wake-up. Now ``run()`` ends with ``ProjectionError``
(``projection_failed``) saying the source database was replaced: the host reopens the store at its
path and the builder then rebuilds onto the new source. On PostgreSQL a schema dropped and recreated
is a new source identity the store's next connection sees: the builder rebuilds onto it while it
follows.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fencepost
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.conftest import drop_schema, require_postgres
from tests.projections import _runs
from tests.projections._following import Following


def _replace_source(url: str) -> None:
    """A fresh store at ``url``: the SQLite file deleted and recreated, or the schema dropped."""
    if url.startswith("sqlite:"):
        path = url[len("sqlite:///"):]
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.remove(f"{path}{suffix}")
            except FileNotFoundError:
                pass
    else:
        drop_schema(require_postgres(), url.rsplit("schema=", 1)[1])
    with fencepost.open(url) as fresh:
        for i in range(3):
            fresh.runs.create(f"new-{i}", "{}")


def test_a_builder_following_a_replaced_source_database_never_goes_on_with_the_old_one(
        backend, db_url, make_db_url):
    target_url = make_db_url()
    store = fencepost.open(db_url)
    store.db.write(lambda conn: [_runs.create(conn, f"old-{i}", i) for i in range(5)])
    builder = ProjectionBuilder(store, target_url, RunsByStatus(), poll_interval=0.2)
    try:
        with Following(builder) as following:
            assert following.wait(lambda: builder.status().applied_revision >= 5)
            assert builder.status().applied_revision == 5
            _replace_source(db_url)
            if backend == "sqlite":
                following.thread.join(timeout=20)
                assert not following.thread.is_alive()
                [error] = following.failure
                assert isinstance(error, ProjectionError) and error.code == "projection_failed", error
                assert error.source_replaced and error.store is None  # what the command line reads
                assert "replaced" in str(error) and str(Path(db_url[len("sqlite:///"):])) not in str(error)
                # Reopened at its path, the store is the new database and a builder rebuilds onto it.
                builder.close()
                store.close()
                store = fencepost.open(db_url)
                builder = ProjectionBuilder(store, target_url, RunsByStatus())
                assert builder.catch_up().rebuilt
            else:
                following.wait(lambda: set(builder.target.read(_runs.projected_rows)) == {"new-0", "new-1", "new-2"})
                assert builder.status().rebuilds == 1
            assert set(builder.target.read(_runs.projected_rows)) == {"new-0", "new-1", "new-2"}
    finally:
        builder.close()
        store.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_an_untouched_sqlite_source_keeps_being_followed(db_url, make_db_url):
    """The file check does not fire on ordinary commits: the builder keeps following."""
    store = fencepost.open(db_url)
    with ProjectionBuilder(store, make_db_url(), RunsByStatus(), poll_interval=0.2) as builder:
        with Following(builder) as following:
            for i in range(5):
                store.runs.create(f"r{i}", "{}")
            following.wait(lambda: builder.status().applied_revision >= 5)
            assert builder.status().lag == 0 and following.thread.is_alive() and not following.failure
    store.close()
    assert not following.failure
