"""A run state nested past the depth limit is refused naming the limit, on SQLite and PostgreSQL.

``runs create --state`` and ``runs create -`` parsed the JSON with the decoder alone, which gives up
on very deep nesting with a ``RecursionError``: the CLI's last-resort boundary printed
``RecursionError: maximum recursion depth exceeded while deserializing an object`` (exit 1), a
message about Python, not about the state. Both now say the state exceeds the depth limit (the
store's own rule, 128), create nothing, and ``--state`` is a usage error (exit 2) like any
``--state`` that cannot be stored.
"""

from __future__ import annotations

import os
import subprocess

import pytest

import fencepost
from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _run(db_url: str, *args: str, stdin: str | None = None, cwd) -> Result:
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.run([fencepost_exe(), "--db", db_url, *args], capture_output=True, text=True, input=stdin,
                          cwd=cwd, env=env, timeout=60)
    return Result(proc)


def _assert_nothing_created(db_url: str) -> None:
    with fencepost.open(db_url, readonly=True) as store:
        assert store.feed.count_runs() == 0


@pytest.fixture
def empty_store(db_url):
    fencepost.open(db_url).close()
    return db_url


@pytest.mark.parametrize("depth", [200, 5000], ids=["past-the-limit", "past-the-decoder"])
def test_state_option_nested_too_deep_is_a_usage_error_naming_the_limit(empty_store, tmp_path, depth):
    result = _run(empty_store, "runs", "create", "r1", "--state", _nested(depth), cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2, result
    assert "--state" in result.err and "depth limit of 128" in result.err, result
    assert "Recursion" not in result.err, result
    _assert_nothing_created(empty_store)


def test_stdin_state_nested_too_deep_names_the_line_and_the_limit(empty_store, tmp_path):
    lines = '{"run_id": "r1", "state": {}}\n{"run_id": "r2", "state": ' + _nested(5000) + "}\n"
    result = _run(empty_store, "runs", "create", "-", stdin=lines, cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 1, result
    assert "stdin line 2" in result.err and "depth limit of 128" in result.err, result
    assert "Recursion" not in result.err, result
    _assert_nothing_created(empty_store)
