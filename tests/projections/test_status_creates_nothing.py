"""Making a builder and reading its status creates nothing at a SQLite target that does not exist.

Defect: ``ProjectionBuilder(store, "sqlite:///a/b/target.db", ...)`` made the target's missing
parent directories at construction, so a read (``status``, ``rebuilds``, ``fencepost projection
status`` through the library) left empty directories behind. They are now made by the first write (catch_up, rebuild,
run). ``fencepost projection status`` already opened the target read-only and says it is missing
(checked here too). The target is SQLite only (a PostgreSQL target has no directories to make); the source runs
on both backends.
"""

from __future__ import annotations

from click.testing import CliRunner

from fencepost.cli import cli
from fencepost.projections import ProjectionBuilder, RunsByStatus


def test_status_of_a_target_that_does_not_exist_creates_nothing(store, tmp_path):
    store.runs.create("r", "{}")
    url = f"sqlite:///{tmp_path / 't' / 'a' / 'b' / 'target.db'}"
    with ProjectionBuilder(store, url, RunsByStatus()) as builder:
        status = builder.status()
        assert (status.source, status.applied_revision, status.lag) == (None, 0, status.source_revision)
        assert builder.rebuilds() == []
        assert not (tmp_path / "t").exists()
        builder.catch_up()  # the first write makes them
        assert builder.status().lag == 0
    assert (tmp_path / "t" / "a" / "b" / "target.db").is_file()


def test_the_cli_status_of_a_target_that_does_not_exist_creates_nothing(db_url, store, tmp_path):
    target = tmp_path / "a" / "b" / "target.db"
    result = CliRunner().invoke(cli, ["--db", db_url, "projection", "status", "--name", "runs_by_status",
                                       "--target", f"sqlite:///{target}"])
    said = f"{result.output}{result.exception}"
    assert result.exit_code != 0
    assert "database_missing" in said and "build the projection there first" in said, said
    assert not (tmp_path / "a").exists(), said
