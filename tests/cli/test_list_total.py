"""``runs list`` counts the matching runs only for a format that prints the count.

The table's "showing N of M" and the json document's "total" need a count of every matching run,
which reads the whole run table (or all of one status) on a large store. jsonl and csv print the
runs alone, yet the count ran for them too, on every page a script fetched: now it does not.
Checked by the statements the command sends, on one store and across two.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

import fencepost

pytestmark = pytest.mark.cli_in_process


@pytest.fixture
def counts() -> Iterator[list[str]]:
    """Every count of runs sent to any database while the test runs."""
    seen: list[str] = []

    def capture(_conn, _cursor, statement, _parameters, _context, _many) -> None:
        if statement.lower().startswith("select count(") and "from flows_runs" in statement.lower():
            seen.append(statement)

    event.listen(Engine, "before_cursor_execute", capture)
    yield seen
    event.remove(Engine, "before_cursor_execute", capture)


def _fill(url: str, run_ids: list[str]) -> None:
    with fencepost.open(url) as store:
        for run_id in run_ids:
            store.runs.create(run_id, "{}")


def test_runs_list_counts_for_a_table_and_json_only(run_cli, db_url, counts) -> None:
    _fill(db_url, ["r1", "r2", "r3"])
    table = run_cli("--db", db_url, "runs", "list", "--limit", "2")
    assert table.code == 0 and "showing 2 of 3" in table.out, table
    assert len(counts) == 1
    doc = run_cli("--db", db_url, "runs", "list", "--limit", "2", "--format", "json")
    assert doc.code == 0 and json.loads(doc.out)["total"] == 3, doc
    assert len(counts) == 2
    counts.clear()
    lines = run_cli("--db", db_url, "runs", "list", "--limit", "2", "--format", "jsonl")
    assert [json.loads(line)["run_id"] for line in lines.out.splitlines()] == ["r1", "r2"], lines
    rows = run_cli("--db", db_url, "runs", "list", "--format", "csv")
    assert [r["run_id"] for r in csv.DictReader(io.StringIO(rows.out))] == ["r1", "r2", "r3"], rows
    assert counts == []


def test_runs_list_across_stores_counts_for_a_table_and_json_only(run_cli, make_db_url, counts) -> None:
    a, b = make_db_url(), make_db_url()
    _fill(a, ["a1", "a2"])
    _fill(b, ["b1"])
    stores = ["--db", f"one={a}", "--db", f"two={b}"]
    table = run_cli(*stores, "runs", "list")
    assert table.code == 0 and "showing 3 of 3 in 2 stores" in table.out, table
    doc = run_cli(*stores, "runs", "list", "--format", "json")
    assert doc.code == 0 and json.loads(doc.out)["total"] == 3, doc
    assert len(counts) == 4  # one per store, for each of the two
    counts.clear()
    lines = run_cli(*stores, "runs", "list", "--format", "jsonl")
    assert sorted(json.loads(line)["run_id"] for line in lines.out.splitlines()) == ["a1", "a2", "b1"], lines
    rows = run_cli(*stores, "runs", "list", "--format", "csv")
    assert len(list(csv.DictReader(io.StringIO(rows.out)))) == 3, rows
    assert counts == []
