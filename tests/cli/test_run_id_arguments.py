"""A run id typed on the command line that no run can have is a usage error (exit 2), as an empty
one already was.

The CLI refused an empty RUN_ID itself (exit 2) but passed a 10,000-character one, or one holding
bytes that are not UTF-8, to the store, whose refusal came back as a failure (exit 1), the code a
script reads as "the command ran and failed" (an unknown run, an unreachable database). Each is now
refused while the arguments are parsed, naming the argument and the rule, never the id, with
nothing written. Both backends: ``runs create`` must leave the store empty on each.
"""

from __future__ import annotations

import os
import subprocess

import pytest

import fencepost
from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe

LONG = "order-" + "x" * 9994  # 10,000 characters; the rule is at most 1024 UTF-16 units
NOT_UTF8 = b"order-\xff"

COMMANDS = [
    ["runs", "show"], ["runs", "cancel"], ["runs", "delete"], ["runs", "retry"], ["runs", "create"],
    ["journal", "show"], ["journal", "replay"], ["feed", "snapshot"],
]


def _run(db_url: str, *args: str | bytes, cwd) -> Result:
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.run([fencepost_exe(), "--db", db_url, *args], capture_output=True, cwd=cwd, env=env,
                          timeout=60)
    proc.stdout = proc.stdout.decode("utf-8", "backslashreplace")
    proc.stderr = proc.stderr.decode("utf-8", "backslashreplace")
    return Result(proc)


@pytest.fixture
def empty_store(db_url):
    fencepost.open(db_url).close()
    return db_url


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_an_overlong_run_id_is_a_usage_error_naming_the_limit(empty_store, tmp_path, command):
    result = _run(empty_store, *command, LONG, cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2, result
    assert "1024" in result.err and "RUN_ID" in result.err, result
    assert "xxxxxxxxxx" not in result.err, result


@pytest.mark.parametrize("command", [["runs", "show"], ["runs", "create"]], ids=["show", "create"])
def test_a_run_id_that_is_not_utf8_is_a_usage_error(empty_store, tmp_path, command):
    result = _run(empty_store, *command, NOT_UTF8, cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2, result
    assert "RUN_ID" in result.err and "UTF-8" in result.err and "order-" not in result.err, result


def test_an_overlong_new_id_is_a_usage_error_and_nothing_is_created(empty_store, tmp_path):
    with fencepost.open(empty_store) as store:
        store.runs.create("r1", "{}")
    result = _run(empty_store, "runs", "retry", "r1", "--new-id", LONG, cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2 and "--new-id" in result.err, result
    with fencepost.open(empty_store, readonly=True) as store:
        assert store.feed.count_runs() == 1
