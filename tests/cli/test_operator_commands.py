"""Operator commands: runs create / retry / delete, cancel notes. Through ``fencepost.cli.main``
in-process; the real console script where stdin or a worker is involved."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import fencepost
from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Claimed
from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe

OWNER = OwnerId("ops-host", 4242, "ops-nonce")


# Each command runs through fencepost.cli.main in this interpreter (see run_cli in conftest.py).
pytestmark = pytest.mark.cli_in_process


def _stdin(db_url: str, args: list[str], text: str) -> Result:
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    env["COLUMNS"] = "200"
    return Result(subprocess.run([fencepost_exe(), "--db", db_url, *args], input=text, capture_output=True,
                                 text=True, env=env, timeout=60))


def _init(run_cli, db_url: str) -> None:
    assert run_cli("--db", db_url, "init").code == 0


def _own(store, run_id: str) -> None:
    row = store.runs.get(run_id)
    claimed = store.runs.claim(run_id, row.snapshot(), OWNER, store.clock.now_ms())
    assert isinstance(claimed, Claimed)
    store.runs.activate(run_id, OWNER, claimed.claimed_at_ms, row)


def test_runs_create_stores_the_state_and_a_duplicate_says_it_already_exists(run_cli, db_url):
    _init(run_cli, db_url)
    result = run_cli("--db", db_url, "runs", "create", "order-17", "--state", '{"step": 0}')
    assert result.code == 0, result
    assert "order-17" in result.out
    with fencepost.open(db_url, readonly=True) as store:
        assert store.runs.get("order-17").state_json == '{"step": 0}'
    again = run_cli("--db", db_url, "runs", "create", "order-17", "--state", "{}")
    assert_one_line_error(again)
    assert again.code == 1 and "a run with this id already exists" in again.err
    assert "persistence failed" not in again.err
    bad = run_cli("--db", db_url, "runs", "create", "order-18", "--state", "{nope")
    assert_one_line_error(bad)
    assert bad.code == 2 and "--state" in bad.err and "must be JSON text" in bad.err


def test_runs_create_dash_reads_ndjson_from_stdin_all_or_nothing(run_cli, db_url):
    _init(run_cli, db_url)
    lines = "".join(json.dumps({"run_id": f"n{i}", "state": {"i": i}}) + "\n" for i in range(5))
    result = _stdin(db_url, ["runs", "create", "-"], lines)
    assert result.code == 0, result
    assert "created 5 run(s)" in result.out
    with fencepost.open(db_url, readonly=True) as store:
        assert json.loads(store.runs.get("n3").state_json) == {"i": 3}
    # One duplicate in the batch: nothing of the batch is created.
    batch = json.dumps({"run_id": "fresh"}) + "\n" + json.dumps({"run_id": "n1"}) + "\n"
    dup = _stdin(db_url, ["runs", "create", "-"], batch)
    assert_one_line_error(dup)
    assert "already exists" in dup.err and "stdin line 2" in dup.err
    bad = _stdin(db_url, ["runs", "create", "-"], json.dumps({"run_id": "fresh2"}) + "\n{oops\n")
    assert_one_line_error(bad)
    assert "line 2" in bad.err
    with fencepost.open(db_url, readonly=True) as store:
        ids = {r.run_id for r in store.feed.list_runs(None, None, 100).runs}
    assert "fresh" not in ids and "fresh2" not in ids


def test_runs_retry_starts_a_new_round_and_is_refused_when_cancelled(run_cli, db_url):
    with fencepost.open(db_url) as store:
        store.runs.create("job", "{}")
        _own(store, "job")
        store.runs.transition_owned("job", OWNER, "failed", state_json='{"step": 4}')
        store.runs.create("asked", "{}")
        _own(store, "asked")
        store.runs.request_cancel("asked", store.clock.now_ms())
        store.runs.transition_owned("asked", OWNER, "cancelled", guard={"cancel_requested": "present"})
    result = run_cli("--db", db_url, "runs", "retry", "job", "--json")
    assert result.code == 0, result
    row = json.loads(result.out)
    assert row["status"] == "pending" and row["lineage_id"] == "job" and row["round_ordinal"] == 1
    assert row["state_json"] == '{"step": 4}'
    shown = run_cli("--db", db_url, "runs", "show", row["run_id"])
    assert shown.code == 0 and "job / 1" in shown.out
    # The first round is round 0 of its own lineage, as the change feed and the console say.
    first = run_cli("--db", db_url, "runs", "show", "job")
    assert first.code == 0 and "job / 0" in first.out, first.out
    live = run_cli("--db", db_url, "runs", "retry", "job")
    assert_one_line_error(live)
    assert "still live" in live.err
    refused = run_cli("--db", db_url, "runs", "retry", "asked")
    assert_one_line_error(refused)
    assert refused.code == 1 and "cancellation request" in refused.err


def test_runs_delete_tombstones_and_refuses_a_running_run_without_force(run_cli, db_url):
    with fencepost.open(db_url) as store:
        store.runs.create("old", "{}")
        store.runs.create("busy", "{}")
        _own(store, "busy")
        before = store.feed.position()
    result = run_cli("--db", db_url, "runs", "delete", "old")
    assert result.code == 0, result
    refused = run_cli("--db", db_url, "runs", "delete", "busy")
    assert_one_line_error(refused)
    assert refused.code == 1 and "--force" in refused.err and "running" in refused.err, refused.err
    forced = run_cli("--db", db_url, "runs", "delete", "busy", "--force")
    assert forced.code == 0, forced
    with fencepost.open(db_url, readonly=True) as store:
        changes = store.feed.changes_since(before).changes
    assert {(c.run_id, c.deleted) for c in changes} == {("old", True), ("busy", True)}
    missing = run_cli("--db", db_url, "runs", "delete", "old")
    assert_one_line_error(missing)


def test_cancelling_a_pending_run_settles_it_when_a_worker_claims_it(run_cli, run_cli_subprocess, db_url,
                                                                      tmp_path):
    (tmp_path / "marktasks.py").write_text(
        "def work(ctx):\n"
        "    raise AssertionError('the function of a cancelled run must not run')\n"
    )
    with fencepost.open(db_url) as store:
        store.runs.create("p", "{}")
    assert run_cli("--db", db_url, "runs", "cancel", "p").code == 0
    with fencepost.open(db_url, readonly=True) as store:
        row = store.runs.get("p")
    assert row.status == "pending" and row.cancel_requested_at_ms is not None
    result = run_cli_subprocess("--db", db_url, "worker", "-n", "1", "--task", "marktasks:work", "--until-idle",
                                cwd=tmp_path, timeout=90)
    assert result.code == 0, result
    with fencepost.open(db_url, readonly=True) as store:
        row = store.runs.get("p")
    assert row.status == "cancelled" and row.failure is None


def test_runs_create_dash_names_the_line_that_is_not_utf8_and_creates_nothing(run_cli, db_url):
    """A line of stdin that is not UTF-8 was reported as the interpreter's
    ``UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0``: no line number, a
    byte of the input echoed. Now it names the line, like a line that is not JSON; nothing is created.
    A byte order mark before the first line is accepted, as a shard file's is."""
    _init(run_cli, db_url)
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    text = b'{"run_id": "good"}\n{"run_id": "bad\xff"}\n'
    proc = subprocess.run([fencepost_exe(), "--db", db_url, "runs", "create", "-"], input=text,
                          capture_output=True, env=env, timeout=60)
    result = Result(subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(),
                                                proc.stderr.decode()))
    assert_one_line_error(result)
    assert result.code == 1
    assert "stdin line 2" in result.err and "UTF-8" in result.err, result
    assert "0xff" not in result.err and "UnicodeDecodeError" not in result.err, result
    with fencepost.open(db_url, readonly=True) as store:
        assert store.feed.count_runs(None) == 0
    bom = subprocess.run([fencepost_exe(), "--db", db_url, "runs", "create", "-"],
                         input='\ufeff{"run_id": "b1"}\r\n{"run_id": "b2"}\r\n'.encode(), capture_output=True,
                         env=env, timeout=60)
    assert bom.returncode == 0, bom
    with fencepost.open(db_url, readonly=True) as store:
        assert sorted(r.run_id for r in store.feed.list_runs(None, None, 10).runs) == ["b1", "b2"]


def test_runs_create_dash_prints_one_row_per_created_run_in_csv_and_jsonl(run_cli, db_url):
    """csv printed one "created" cell holding a JSON list; jsonl one line holding that list."""
    import csv
    import io

    _init(run_cli, db_url)
    ids = ["c1", "c,2", 'c"3']
    lines = "".join(json.dumps({"run_id": rid}) + "\n" for rid in ids)
    result = _stdin(db_url, ["runs", "create", "-", "--format", "csv"], lines)
    assert result.code == 0, result
    assert list(csv.reader(io.StringIO(result.out))) == [["run_id"], *[[rid] for rid in ids]]
    more = [f"l{i}" for i in range(3)]
    result = _stdin(db_url, ["runs", "create", "-", "--format", "jsonl"], "".join(
        json.dumps({"run_id": rid}) + "\n" for rid in more))
    assert result.code == 0, result
    assert [json.loads(line) for line in result.out.splitlines()] == [{"run_id": rid} for rid in more]
    result = _stdin(db_url, ["runs", "create", "-", "--json"], json.dumps({"run_id": "j1"}) + "\n")
    assert result.code == 0 and json.loads(result.out) == {"created": ["j1"]}, result
