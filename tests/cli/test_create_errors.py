"""``runs create -`` names the stdin line a refused run came from, never its id, on SQLite and PostgreSQL.

The store names a refused run of ``create_many`` by its index in the list (``runs[1]``), counted
from 0 and over the runs only: blank lines of the input were not counted, so an operator holding a
thousand-line file could not tell which line was the duplicate. The CLI now says ``stdin line N``
(counted from 1, blank lines included, as its parse errors already do). Run ids are not echoed:
errors name fields and positions, never values (an id may carry a customer's name or an email).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import fencepost
from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe

SECRET = "order-for-alice@example.com"


@pytest.fixture
def one_run(db_url):
    with fencepost.open(db_url) as store:
        store.runs.create(SECRET, "{}")
    return db_url


def _create(db_url, text):
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    return Result(subprocess.run([fencepost_exe(), "--db", db_url, "runs", "create", "-"], input=text,
                                 capture_output=True, text=True, env=env, timeout=60))


def _ids(db_url):
    """Which of the runs these tests give exist."""
    from fencepost.runstore._reading import run_exists

    with fencepost.open(db_url, readonly=True) as store:
        return [i for i in (SECRET, "new-1", "new-2", "twice", "other", "fine") if run_exists(store, i)]


def test_a_duplicate_of_a_stored_run_names_its_stdin_line(one_run):
    text = '{"run_id": "new-1"}\n\n{"run_id": "new-2"}\n' + json.dumps({"run_id": SECRET}) + "\n"
    result = _create(one_run, text)
    assert_one_line_error(result)
    assert result.code == 1, result
    assert "stdin line 4: a run with this id already exists" in result.err, result
    assert "no run was created" in result.err, result
    assert "runs[" not in result.err and SECRET not in result.err, result
    assert _ids(one_run) == [SECRET]


def test_an_id_given_twice_names_both_lines(one_run):
    text = '{"run_id": "twice"}\n\n{"run_id": "other"}\n{"run_id": "twice"}\n'
    result = _create(one_run, text)
    assert_one_line_error(result)
    assert "stdin line 4: a run with this id already exists (stdin line 1)" in result.err, result
    assert "twice" not in result.err, result
    assert _ids(one_run) == [SECRET]


def test_a_refused_id_names_its_stdin_line(one_run):
    text = '\n{"run_id": "fine"}\n' + json.dumps({"run_id": "x" * 1025}) + "\n"
    result = _create(one_run, text)
    assert_one_line_error(result)
    assert "stdin line 3: run_id must be at most 1024 UTF-16 units (got 1025)" in result.err, result
    assert _ids(one_run) == [SECRET]


def test_a_duplicate_given_as_an_argument_is_refused_without_its_id(run_cli, one_run):
    result = run_cli("--db", one_run, "runs", "create", SECRET)
    assert_one_line_error(result)
    assert "a run with this id already exists" in result.err and SECRET not in result.err, result


@pytest.mark.parametrize("extra", [['{"done": 7}'], ['{"api_key": "k-123456"}', "--format", "json"], ["xq1", "xq2"]])
def test_a_state_given_as_a_second_argument_points_to_state(one_run, extra):
    """``runs create ID '{...}'``, the library's ``store.runs.create(id, state)`` typed on the command
    line (as the README shows it), said only ``Got unexpected extra argument ({...})``: the state
    echoed back, no word of ``--state``. Now a usage error naming ``--state``, the value not
    repeated, and no run created. On both backends: nothing may be written before the refusal."""
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    result = Result(subprocess.run([fencepost_exe(), "--db", one_run, "runs", "create", "new-1", *extra],
                                   capture_output=True, text=True, env=env, timeout=60))
    assert_one_line_error(result)
    assert result.code == 2, result
    assert "--state JSON" in result.err and "extra argument" in result.err, result
    assert extra[0] not in result.err, result
    assert _ids(one_run) == [SECRET]
