"""The operator's command line: help, errors and exit codes, output formats, ``runs list`` paging.

On SQLite and PostgreSQL; commands run in-process through ``fencepost.cli.main`` (the error
boundary), and the real ``fencepost`` console script in a subprocess where a pipe, a terminal or
the process is what is tested.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from pathlib import Path

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.journal.owner import OwnerId
from tests.cli.conftest import assert_one_line_error, fencepost_exe, on_a_terminal

A = OwnerId("host-a", 101, "owner-a")
LONG = "order-" + "x" * 70  # longer than any narrow terminal column: folding would break it
SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
USER_DATA = {"state", "payload", "meta"}  # recorded by the user: shown exactly as written
DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


# Each command runs through fencepost.cli.main in this interpreter (see run_cli in conftest.py).
pytestmark = pytest.mark.cli_in_process


@pytest.fixture
def operated(db_url):
    """Runs in every shape: pending with a long id, a running one with an acknowledged cancellation,
    completed ones of two flows, one whose state has nested camelCase keys."""
    with fencepost.open(db_url, clock=ManualClock(1_000_000)) as store:
        store.runs.create(f"{LONG}-1", '{"flowName": "checkout", "orderItems": [{"skuId": 1}]}')
        store.runs.create("r-ack", '{"flowName": "billing"}')
        store.runs.claim_and_own("r-ack", store.runs.get("r-ack").snapshot(), A, store.clock.now_ms())
        store.runs.request_cancel("r-ack", store.clock.now_ms())
        assert store.runs.acknowledge_cancel("r-ack", A, store.clock.now_ms()) is True
        store.runs.create("r-plain", "[1, 2, 3]")
    return db_url


# ---------------------------------------------------------------------- help
@pytest.mark.parametrize("group", [[], ["runs"], ["journal"], ["feed"], ["source"], ["projection"]],
                         ids=["fencepost", "runs", "journal", "feed", "source", "projection"])
def test_a_bare_group_prints_its_normal_help(run_cli, group):
    result = run_cli(*group)
    assert result.code == 0, result
    assert result.err == ""
    lines = result.out.splitlines()
    assert lines[0].startswith(f"Usage: fencepost {' '.join(group)}".rstrip() + " ")
    assert "Commands:" in lines and len(lines) > 8
    assert not result.out.startswith("Error")


# ---------------------------------------------------------------------- errors and exit codes
def test_runs_cancel_of_an_unknown_run_is_one_line_on_stderr_and_nothing_on_stdout(run_cli, operated):
    result = run_cli("--db", operated, "runs", "cancel", "nope")
    assert_one_line_error(result)
    assert result.code == 1 and result.out == "" and result.err.startswith("Error: ")
    # The same words as every other command given an unknown run (runs show, retry, delete).
    assert "not_found_row" in result.err and "no run with this id" in result.err, result.err


def test_a_failing_journal_check_reports_on_stdout_and_fails_on_stderr(run_cli, operated):
    from sqlalchemy import update

    from fencepost._schema import flows_journal_events as events
    from fencepost.journal import companion_stream
    from tests.cli.test_audit import _drop_append_only_guard

    with fencepost.open(operated) as store, store.db.connect() as conn:
        _drop_append_only_guard(store, conn)
        conn.execute(update(events).where(events.c.run_id == companion_stream("r-ack"), events.c.seq == 0)
                     .values(payload_json='{"runId":"r-ack"}'))
        conn.commit()
    result = run_cli("--db", operated, "journal", "verify")
    assert result.code == 1, result
    assert "journal broken" in result.out
    assert_one_line_error(result)
    assert "journal is broken" in result.err


def test_usage_errors_exit_2_and_the_exit_codes_are_documented(run_cli):
    assert run_cli("runs", "list", "--format", "yaml").code == 2
    assert run_cli("runs", "list", "--json", "--format", "csv").code == 2
    header = DOC.read_text().split("\n## ")[0]
    for code, meaning in (("0", "success"), ("1", "failure"), ("2", "usage"), ("130", "interrupted")):
        assert re.search(rf"^\| {code} \| {meaning}", header, re.M), code


# ---------------------------------------------------------------------- formats
READS = [
    ["runs", "list"],
    ["runs", "show", "r-ack"],
    ["journal", "show", "r-ack", "--companion"],
    ["journal", "replay", "r-ack"],
    ["journal", "verify"],
    ["feed", "tail"],
    ["feed", "snapshot", "r-ack", f"{LONG}-1", "nope"],
    ["source", "show"],
    ["projection", "status"],
]


def _keys_are_snake(value, path="$"):
    if isinstance(value, dict):
        for k, v in value.items():
            assert SNAKE.match(k), f"{path}.{k} is not snake_case"
            if k not in USER_DATA:
                _keys_are_snake(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _keys_are_snake(v, f"{path}[{i}]")


@pytest.mark.parametrize("args", READS, ids=[" ".join(a[:2]) for a in READS])
def test_every_read_command_prints_every_format_with_snake_case_keys(run_cli, operated, args):
    as_json = run_cli("--db", operated, *args, "--json")
    assert as_json.code == 0, as_json
    document = json.loads(as_json.out)
    _keys_are_snake(document)
    if args == READS[0]:  # --json is one shared option (cli._output): its long form checked once
        assert json.loads(run_cli("--db", operated, *args, "--format", "json").out) == document

    jsonl = run_cli("--db", operated, *args, "--format", "jsonl")
    assert jsonl.code == 0, jsonl
    objects = [json.loads(line) for line in jsonl.out.splitlines()]
    assert objects and all(isinstance(o, dict) for o in objects)
    for o in objects:
        _keys_are_snake(o)

    as_csv = run_cli("--db", operated, *args, "--format", "csv")
    assert as_csv.code == 0, as_csv
    rows = list(csv.reader(io.StringIO(as_csv.out)))
    assert len(rows) == len(objects) + 1, "a header, then one row per record"
    assert all(SNAKE.match(h) for h in rows[0]) and all(len(r) == len(rows[0]) for r in rows)

    table = run_cli("--db", operated, *args)
    assert table.code == 0 and table.out.strip(), table


def test_runs_carry_the_decoded_state_beside_the_verbatim_state_json(run_cli, operated):
    page = json.loads(run_cli("--db", operated, "runs", "list", "--json").out)
    by_id = {r["run_id"]: r for r in page["runs"]}
    long_run = by_id[f"{LONG}-1"]
    assert long_run["state_json"] == '{"flowName": "checkout", "orderItems": [{"skuId": 1}]}'
    assert long_run["state"] == {"flowName": "checkout", "orderItems": [{"skuId": 1}]}
    assert by_id["r-plain"]["state"] == [1, 2, 3]
    shown = json.loads(run_cli("--db", operated, "runs", "show", "r-ack", "--json").out)["run"]
    assert shown["state"] == {"flowName": "billing"}
    assert shown["cancel_acknowledgement"] == {
        "observed_at_ms": 1_000_000, "owner": {"host_id": "host-a", "pid": 101, "nonce": "owner-a"}}


def test_a_table_written_to_a_pipe_never_folds_a_run_id(operated, tmp_path):
    """A real shell pipeline on a narrow terminal: grep finds the whole id, each run on one line."""
    env = {"COLUMNS": "40", "PATH": str(Path(fencepost_exe()).parent) + ":/usr/bin:/bin"}
    pipeline = f"{fencepost_exe()} --db '{operated}' runs list | grep -F -- '{LONG}-1'"
    proc = subprocess.run(["/bin/sh", "-c", pipeline], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc
    found = proc.stdout.splitlines()
    assert len(found) == 1 and found[0].split()[:2] == [f"{LONG}-1", "pending"]
    # Every line of the piped table is one record (or the header/footer), none wrapped.
    whole = subprocess.run(["/bin/sh", "-c", f"{fencepost_exe()} --db '{operated}' runs list | cat"],
                           capture_output=True, text=True, env=env, timeout=60).stdout.splitlines()
    assert whole[0].split()[:2] == ["run_id", "status"]
    assert sorted(line.split()[0] for line in whole[1:4]) == sorted([f"{LONG}-1", "r-ack", "r-plain"])
    assert whole[4:] == ["showing 3 of 3"]


@pytest.mark.parametrize("columns", ["60", "200"], ids=["narrow", "wide"])
def test_a_table_on_a_terminal_keeps_run_ids_whole(operated, columns):
    """On a real terminal (a pty): a drawn table when the ids fit, else plain lines, never a cut id."""
    text = on_a_terminal("--db", operated, "runs", "list", columns=columns)
    assert f"{LONG}-1" in text, text
    assert ("┃" in text) == (columns == "200"), text


# ---------------------------------------------------------------------- runs list
@pytest.fixture
def six_hundred(db_url):
    """600 runs, one millisecond apart: 200 of flow "a" created first, then 400 of flow "b"."""
    with fencepost.open(db_url, clock=ManualClock(10_000)) as store:
        for i in range(600):
            store.runs.create(f"run-{i:04d}", json.dumps({"flowName": "a" if i < 200 else "b"}))
            store.clock.advance(1)
    return db_url


def test_runs_list_footer_says_how_many_match_and_how_to_continue(run_cli, six_hundred):
    result = run_cli("--db", six_hundred, "runs", "list")
    assert result.code == 0, result
    lines = result.out.splitlines()
    assert len(lines) == 1 + 100 + 2
    assert lines[-2] == "showing 100 of 600"
    assert lines[-1].startswith("next page: --cursor ")
    assert [line.split()[0] for line in lines[1:3]] == ["run-0000", "run-0001"]


def test_runs_list_cursor_pages_through_every_run_once(run_cli, six_hundred):
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        args = ["--db", six_hundred, "runs", "list", "--limit", "250", "--json"]
        page = json.loads(run_cli(*args, *(["--cursor", cursor] if cursor else [])).out)
        seen += [r["run_id"] for r in page["runs"]]
        assert page["total"] == 600
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"run-{i:04d}" for i in range(600)]


def test_runs_list_cursor_from_the_table_footer_continues_the_listing(run_cli, six_hundred):
    import shlex

    first = run_cli("--db", six_hundred, "runs", "list", "--desc", "--limit", "3")
    cursor = shlex.split(first.out.splitlines()[-1])[-1]
    second = run_cli("--db", six_hundred, "runs", "list", "--desc", "--limit", "3", "--cursor", cursor)
    assert second.code == 0, second
    assert [line.split()[0] for line in second.out.splitlines()[1:4]] == ["run-0596", "run-0595", "run-0594"]
    # A cursor is bound to its order and filters: reused elsewhere it is refused, one line.
    wrong = run_cli("--db", six_hundred, "runs", "list", "--cursor", cursor)
    assert_one_line_error(wrong)
    assert "invalid_cursor" in wrong.err


def test_runs_list_desc_flow_and_creation_window(run_cli, six_hundred):
    desc = json.loads(run_cli("--db", six_hundred, "runs", "list", "--desc", "--limit", "2", "--json").out)
    assert [r["run_id"] for r in desc["runs"]] == ["run-0599", "run-0598"]

    flow = json.loads(run_cli("--db", six_hundred, "runs", "list", "--flow", "a", "--limit", "1000",
                              "--json").out)
    assert flow["total"] == 200 and {r["state"]["flowName"] for r in flow["runs"]} == {"a"}

    # 10_000 is 1970-01-01T00:00:10Z: run-0005 was created at 10_005 ms, run-0009 at 10_009 ms.
    window = run_cli("--db", six_hundred, "runs", "list", "--created-after", "1970-01-01T00:00:10.005Z",
                     "--created-before", "10009", "--format", "jsonl")
    assert window.code == 0, window
    assert [json.loads(line)["run_id"] for line in window.out.splitlines()] == [
        f"run-{i:04d}" for i in range(5, 10)]
    bad = run_cli("--db", six_hundred, "runs", "list", "--created-after", "yesterday-ish")
    assert_one_line_error(bad)
    assert bad.code == 2


def test_runs_list_several_statuses_page_with_one_cursor(run_cli, db_url):
    with fencepost.open(db_url, clock=ManualClock(5_000)) as store:
        for i in range(6):
            store.runs.create(f"s{i}", "{}")
            store.clock.advance(1)
        for i in (1, 3, 5):
            store.runs.claim_and_own(f"s{i}", store.runs.get(f"s{i}").snapshot(), A, store.clock.now_ms())
        store.runs.transition_owned("s5", A, "completed")
    args = ["--db", db_url, "runs", "list", "--status", "running", "--status", "completed", "--limit", "1"]
    first = json.loads(run_cli(*args, "--json").out)
    assert [r["run_id"] for r in first["runs"]] == ["s1"] and first["total"] == 3
    rest = json.loads(run_cli(*args[:-1], "5", "--json", "--cursor", first["next_cursor"]).out)
    assert [r["run_id"] for r in rest["runs"]] == ["s3", "s5"] and rest["next_cursor"] is None


def test_runs_list_csv_with_no_match_still_prints_its_header(run_cli, operated):
    """``runs list --format csv`` matching no run printed nothing at all, not even the header the docs
    promise, so a script's CSV reader failed on the empty file (pandas: EmptyDataError) exactly when
    there was nothing to report. The header is printed with no row, as with rows; across stores
    (``NAME=URL``) it starts with "store"."""
    full = run_cli("--db", operated, "runs", "list", "--format", "csv")
    header = full.out.splitlines()[0]
    empty = run_cli("--db", operated, "runs", "list", "--status", "failed", "--format", "csv")
    assert empty.code == 0, empty
    assert empty.out.splitlines() == [header], empty
    assert list(csv.DictReader(io.StringIO(empty.out))) == []
    labelled = run_cli("--db", f"only={operated}", "runs", "list", "--status", "failed", "--format", "csv")
    assert labelled.code == 0, labelled
    assert labelled.out.splitlines() == [f"store,{header}"], labelled


def test_a_long_flow_name_is_cut_on_a_terminal_and_whole_elsewhere(run_cli, db_url):
    """A 300-character flow name folded into some 38 rows of an 8-wide column, the run's row
    spread over a screen. On a terminal a list table keeps one row per run: free text is cut with
    an ellipsis, the run id (to be copied) stays whole; a pipe and --json keep the whole name."""
    flow = "flow-" + "x" * 290 + "-end"
    run_id = "run-with-a-long-flow-name-0001"
    with fencepost.open(db_url) as store:
        store.runs.create(run_id, json.dumps({"flowName": flow}))
        store.runs.create("r-short", json.dumps({"flowName": "billing"}))
    text = on_a_terminal("--db", db_url, "runs", "list", columns="120")
    lines = text.splitlines()
    assert "┃" in text, text  # a drawn table
    rows = [line for line in lines if run_id in line]
    assert len(rows) == 1, text
    assert "…" in rows[0] and "-end" not in text, text
    assert "billing" in text, text
    # The table is as tall as its runs: header, two rows, borders and the footer.
    assert len([line for line in lines if line.strip()]) <= 8, text
    assert all(len(re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip()) <= 120 for line in lines), text
    piped = run_cli("--db", db_url, "runs", "list")
    assert next(line for line in piped.out.splitlines() if run_id in line).split()[2] == flow, piped
    as_json = json.loads(run_cli("--db", db_url, "runs", "list", "--json").out)
    assert next(r for r in as_json["runs"] if r["run_id"] == run_id)["state"] == {"flowName": flow}
    # One object (runs show) is not a list: its value column folds, nothing is cut with an ellipsis.
    shown = on_a_terminal("--db", db_url, "runs", "show", run_id, columns="100")
    assert shown.count("x") >= 150 and "…" not in shown, shown
