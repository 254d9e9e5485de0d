"""The machine formats of the commands that act on one run name it the same way, on SQLite and
PostgreSQL.

``runs create``, ``runs retry``, ``runs cancel`` and ``runs show`` name the run under ``run_id``;
``runs delete`` printed ``{"deleted": ID, "forced": ...}``: the id under a key that ``feed tail``
and ``feed snapshot`` use for a boolean, so a script reading ``deleted`` from both saw a string
from one and ``true``/``false`` from the other, and one reading ``run_id`` found none.
"""

from __future__ import annotations

import csv
import io
import json

import pytest

import fencepost


@pytest.fixture
def two_runs(db_url):
    with fencepost.open(db_url) as store:
        store.runs.create("gone", "{}")
        store.runs.create("also-gone", "{}")
    return db_url


def test_runs_delete_json_names_the_run_under_run_id_and_deleted_is_a_boolean(run_cli, two_runs):
    result = run_cli("--db", two_runs, "runs", "delete", "gone", "--json")
    assert result.code == 0, result
    assert json.loads(result.out) == {"run_id": "gone", "deleted": True, "forced": False}
    tail = [json.loads(line) for line in
            run_cli("--db", two_runs, "feed", "tail", "--format", "jsonl").out.splitlines()]
    # The same key means the same thing in both: a boolean, beside the run's id.
    assert {c["run_id"]: c["deleted"] for c in tail}["gone"] is True


def test_runs_delete_csv_and_jsonl_have_the_same_fields(run_cli, two_runs):
    csv_result = run_cli("--db", two_runs, "runs", "delete", "gone", "--format", "csv")
    assert csv_result.code == 0, csv_result
    assert list(csv.DictReader(io.StringIO(csv_result.out))) == [
        {"run_id": "gone", "deleted": "true", "forced": "false"}]
    jsonl = run_cli("--db", two_runs, "runs", "delete", "also-gone", "--format", "jsonl")
    assert jsonl.code == 0, jsonl
    assert json.loads(jsonl.out) == {"run_id": "also-gone", "deleted": True, "forced": False}
