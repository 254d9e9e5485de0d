"""Projection fixtures: a target beside the source store, on the same or the other backend."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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


ROOT = Path(__file__).resolve().parents[2]
_children: list[subprocess.Popen[str]] = []


def spawn_child(module: str, *args: str) -> subprocess.Popen[str]:
    """``python -m module args`` from the repository root, stdout and stderr piped as text; killed
    after the test by ``no_child_outlives_its_test`` if still running."""
    # ROOT for the tests package; the PYTHONPATH given to pytest (if any) still decides which fencepost runs.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    _children.append(proc)
    return proc


@pytest.fixture
def no_child_outlives_its_test() -> Iterator[None]:
    """Kill what ``spawn_child`` started during the test and is still running."""
    yield
    while _children:
        proc = _children.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def why(proc: subprocess.Popen[str]) -> str:
    """The exit status and last stderr lines of a child that stopped on its own."""
    if proc.poll() is None:
        return "still running"
    assert proc.stderr is not None
    return f"exit {proc.returncode}: {proc.stderr.read()[-2000:]}"
