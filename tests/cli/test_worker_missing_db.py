"""``fencepost worker`` refuses a database that does not exist, as ``runs create`` and ``runs cancel``
do: a mistyped --db is an error naming ``fencepost init``, never a new empty store."""

from __future__ import annotations

from pathlib import Path

import pytest

import fencepost
from tests.cli.conftest import assert_one_line_error
from tests.conftest import store_exists

TASK = "def work(ctx):\n    return {'done': True}\n"


@pytest.fixture
def missing_url(backend: str, db_url: str, tmp_path: Path) -> str:
    """A store that does not exist: a SQLite file in a folder that does not exist either, or a
    PostgreSQL schema nobody created (``db_url`` gives it a unique name and drops it afterwards)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'tpyo' / 'flows.db'}"
    assert not store_exists(db_url)
    return db_url


def _nothing_created(backend: str, url: str, tmp_path: Path) -> bool:
    if backend == "sqlite":
        return not (tmp_path / "tpyo").exists()
    return not store_exists(url)


def test_worker_on_a_missing_database_fails_and_creates_nothing(run_cli, backend, missing_url, tmp_path):
    (tmp_path / "mytasks.py").write_text(TASK)
    result = run_cli("--db", missing_url, "worker", "-n", "1", "--task", "mytasks:work", "--until-idle",
                     cwd=tmp_path, timeout=90)
    assert_one_line_error(result)
    assert result.code == 1
    assert "fencepost init" in result.err
    assert "database_missing" in result.err
    assert "claimed" not in result.out  # no worker process was started
    assert _nothing_created(backend, missing_url, tmp_path)


def test_worker_refuses_the_missing_database_as_runs_create_does(run_cli, missing_url, tmp_path):
    (tmp_path / "mytasks.py").write_text(TASK)
    worker = run_cli("--db", missing_url, "worker", "--task", "mytasks:work", "--until-idle", cwd=tmp_path)
    create = run_cli("--db", missing_url, "runs", "create", "r1", cwd=tmp_path)
    assert (worker.code, create.code) == (1, 1)
    assert worker.err == create.err


def test_worker_runs_once_the_database_is_initialised(run_cli, missing_url, tmp_path):
    (tmp_path / "mytasks.py").write_text(TASK)
    assert run_cli("--db", missing_url, "init", cwd=tmp_path).code == 0
    assert run_cli("--db", missing_url, "runs", "create", "r1", cwd=tmp_path).code == 0
    result = run_cli("--db", missing_url, "worker", "-n", "1", "--task", "mytasks:work", "--until-idle",
                     cwd=tmp_path, timeout=90)
    assert result.code == 0, result
    with fencepost.open(missing_url, readonly=True) as store:
        assert store.runs.get("r1").status == "completed"


def test_worker_on_several_stores_refuses_one_that_is_missing(run_cli, backend, missing_url, tmp_path):
    """Given as a shard set, every --db must exist too: a mistyped one is not created and founded."""
    (tmp_path / "mytasks.py").write_text(TASK)
    existing = f"sqlite:///{tmp_path / 'present.db'}"
    with fencepost.open(existing):
        pass
    result = run_cli("--db", existing, "--db", missing_url, "worker", "--task", "mytasks:work", "--until-idle",
                     cwd=tmp_path, timeout=90)
    assert_one_line_error(result)
    assert result.code == 1 and "fencepost init" in result.err
    assert _nothing_created(backend, missing_url, tmp_path)
