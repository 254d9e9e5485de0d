"""A projection target that cannot be used says why, in fencepost's own terms, and touches nothing.

A PostgreSQL target that refuses the connection, the role or the database, and a SQLite target
that is not a database, raised the driver's own exception out of ``catch_up``/``rebuild`` (its
message quoting the role or database name) or a bare ``persistence_failed`` out of ``status``.
Each is now a ``ProjectionError`` whose code is the one ``fencepost.open`` gives the same database.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.conftest import require_postgres

UNUSABLE = ["pg-refused", "pg-no-role", "pg-no-database", "sqlite-not-a-database"]
CODES = {"pg-refused": "cannot_connect", "pg-no-role": "auth_failed", "pg-no-database": "database_missing",
         "sqlite-not-a-database": "not_a_database"}


def _target(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite-not-a-database":
        junk = tmp_path / "junk.db"
        junk.write_bytes(b"not a database, just bytes " * 400)
        return f"sqlite:///{junk}"
    base = require_postgres().split("://", 1)[1].split("@", 1)[1]  # host:port/db
    host_port, _db = base.split("/", 1)
    host = host_port.rsplit(":", 1)[0]
    if kind == "pg-refused":
        return f"postgresql+psycopg://someone:secret-pw@{host}:1/test"
    if kind == "pg-no-role":
        return f"postgresql+psycopg://no_such_role_fp:secret-pw@{host_port}/test"
    return f"postgresql+psycopg://postgres:secret-pw@{host_port}/no_such_database_fp"


@pytest.mark.parametrize("kind", UNUSABLE)
def test_an_unusable_target_is_a_projection_error_saying_why(store, kind, tmp_path):
    store.runs.create("r1", "{}")
    url = _target(kind, tmp_path)
    before = (tmp_path / "junk.db").read_bytes() if kind.startswith("sqlite") else None
    builder = ProjectionBuilder(store, url, RunsByStatus())
    try:
        for call in (builder.catch_up, builder.rebuild, builder.status):
            with pytest.raises(ProjectionError) as caught:
                call()
            err = caught.value
            assert err.code == CODES[kind], err
            text = str(err)
            assert "projection target" in text
            assert "secret-pw" not in text and "no_such_role_fp\"" not in text
            assert err.__cause__ is None and err.__context__ is None  # the driver's message is not chained
    finally:
        builder.close()
    if before is not None:
        assert (tmp_path / "junk.db").read_bytes() == before
        assert not list(tmp_path.glob("junk.db.projection-*.lock"))  # refused before taking the lock
    # The source store is untouched and still works.
    assert store.runs.get("r1") is not None


def test_the_target_is_probed_once_per_builder(store, target_url):
    """A usable target costs one extra connection, at the first call only."""
    store.runs.create("r1", "{}")
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        calls = []
        real = builder.target.connect_problem

        def counting() -> object:
            calls.append(1)
            return real()

        builder.target.connect_problem = counting  # type: ignore[method-assign]
        builder.status()
        builder.catch_up()
        builder.catch_up()
        assert len(calls) == 1
        assert builder.status().applied_revision > 0



@pytest.mark.parametrize("kind", ["directory", "through-a-file"])
def test_a_sqlite_target_path_that_cannot_be_a_file_is_a_projection_error_too(store, kind, tmp_path):
    """A target path that is a directory, or whose directories run through a file, was refused by
    the constructor with the ``OpenError`` of ``fencepost.open`` ("Store.open: ... it is a
    directory"), which ``except ProjectionError`` missed; every other unusable target is a
    ``ProjectionError``. Sources on both backends; the target is SQLite only, since only a file
    path can be a directory."""
    (tmp_path / "plain.txt").write_text("a file")
    (tmp_path / "folder").mkdir()
    url = f"sqlite:///{tmp_path / 'folder'}" if kind == "directory" else f"sqlite:///{tmp_path / 'plain.txt' / 'rm.db'}"
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ProjectionError) as caught:
        ProjectionBuilder(store, url, RunsByStatus())
    err = caught.value
    assert err.code == ("not_a_database" if kind == "directory" else "open_failed"), err
    assert err.method == "ProjectionBuilder" and "projection target" in str(err) and "Store.open" not in str(err), err
    assert err.__cause__ is None and err.__context__ is None
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert list((tmp_path / "folder").iterdir()) == []
