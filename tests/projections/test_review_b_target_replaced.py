"""A builder whose SQLite target file is deleted, or has another file moved over it, under it.

Defect (found by a review, SQLite): ``run()`` treated the refusal of the replaced target file
(``db_code`` ``file_replaced``) as an outage and retried it every ``poll_interval`` for ever, never
writing the file now at the path; the one-shot calls said ``persistence_failed`` with the store's
advice, "open the store again", which fits no builder. Now every call (``run`` included) ends with
``ProjectionError`` ``projection_failed`` (``db_code`` ``file_replaced``, not transient) saying the
projection's target file was deleted or replaced and that a new builder on the target URL builds
the projection onto the file now at that path; such a builder does.

SQLite only: a PostgreSQL target has no file; a schema dropped under the builder is created again
by its next call (its tables are missing: ``table_missing``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import fencepost
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections import _runs
from tests.projections._following import Following

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        if os.path.exists(f"{path}{suffix}"):
            os.remove(f"{path}{suffix}")


def _replace(path: Path, how: str, older: Path) -> None:
    _remove(path)
    if how == "replaced":
        shutil.copy(older, path)


def _an_older_copy(tmp_path: Path) -> Path:
    """A target built from another store: what a restored backup of another time looks like."""
    older = tmp_path / "older.db"
    with fencepost.open(f"sqlite:///{tmp_path / 'other.db'}") as other:
        other.runs.create("other-0", "{}")
        with ProjectionBuilder(other, f"sqlite:///{older}", RunsByStatus()) as builder:
            builder.catch_up()
    return older


def _refused_as_replaced(error: BaseException, path: Path) -> None:
    assert isinstance(error, ProjectionError) and error.code == "projection_failed", repr(error)
    assert error.db_code == "file_replaced" and error.transient is False
    message = str(error)
    assert "target" in message and "deleted or replaced" in message and "new ProjectionBuilder" in message
    assert "open the store again" not in message and str(path) not in message


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_run_ends_when_the_target_file_is_replaced_and_a_new_builder_builds_onto_the_new_file(
        db_url, tmp_path, how):
    older = _an_older_copy(tmp_path)
    path = tmp_path / "read.db"
    store = fencepost.open(db_url)
    store.db.write(lambda conn: [_runs.create(conn, f"a-{i}", i) for i in range(3)])
    builder = ProjectionBuilder(store, f"sqlite:///{path}", RunsByStatus(), poll_interval=0.1)
    try:
        with Following(builder) as following:
            assert following.wait(lambda: builder.status().applied_revision >= 3)
            _replace(path, how, older)
            store.db.write(lambda conn: _runs.create(conn, "b-0", 9))
            following.thread.join(timeout=20)
            assert not following.thread.is_alive(), "run() kept retrying a replaced target file"
            [error] = following.failure
            _refused_as_replaced(error, path)
        for call in (builder.catch_up, builder.status, builder.rebuilds):
            with pytest.raises(ProjectionError) as caught:
                call()
            _refused_as_replaced(caught.value, path)
    finally:
        builder.close()
    with ProjectionBuilder(store, f"sqlite:///{path}", RunsByStatus()) as fresh:
        fresh.catch_up()
        assert set(fresh.target.read(_runs.projected_rows)) == {"a-0", "a-1", "a-2", "b-0"}
        assert fresh.status().lag == 0
    store.close()
