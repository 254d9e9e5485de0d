"""Every command against a populated database, on SQLite and PostgreSQL, through the real executable."""

from __future__ import annotations

import json
import os
import subprocess
import time

import msgspec
import pytest

import fencepost
from fencepost.clock import SystemClock
from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Claimed
from fencepost.runstore.rows import RunRow
from tests.cli.conftest import assert_one_line_error, fencepost_exe, worker_holding_runs

A = OwnerId("host-a", 101, "owner-a")


# Each command runs through fencepost.cli.main in this interpreter (see run_cli in conftest.py).
pytestmark = pytest.mark.cli_in_process


def _own(store, run_id: str, owner: OwnerId) -> None:
    row = store.runs.get(run_id)
    claimed = store.runs.claim(run_id, row.snapshot(), owner, store.clock.now_ms())
    assert isinstance(claimed, Claimed)
    store.runs.activate(run_id, owner, claimed.claimed_at_ms, row)


@pytest.fixture
def populated(db_url):
    """Three runs: pending ``r-pending``, completed ``r-done``, running ``r-live`` with a reconfirm warning."""
    with fencepost.open(db_url, clock=SystemClock()) as store:
        for run_id in ("r-pending", "r-done", "r-live"):
            store.runs.create(run_id, '{"flowName":"demo"}')
        _own(store, "r-done", A)
        store.runs.transition_owned("r-done", A, "completed", state_json='{"ok":true}')
        _own(store, "r-live", A)
        store.journal.append("r-live", "flows.engine.run-decision",
                             {"decision": "lease-reconfirmed", "detail": {"unconfirmedMs": 19_000}},
                             owner=A, source_id="flows.engine")
    return db_url


def test_runs_list_json_is_a_page_of_run_rows(run_cli, populated):
    result = run_cli("--db", populated, "runs", "list", "--json")
    assert result.code == 0, result
    page = json.loads(result.out)
    assert page["next_cursor"] is None and page["total"] == 3
    fields = set(RunRow.__struct_fields__)
    rows = [msgspec.convert({k: v for k, v in r.items() if k in fields}, RunRow) for r in page["runs"]]
    # Listing order is the keyset (created_at_ms, run_id); runs created within one millisecond tie on time.
    assert sorted(r.run_id for r in rows) == ["r-done", "r-live", "r-pending"]
    assert [r.run_id for r in rows] == [r.run_id for r in sorted(rows, key=lambda r: (r.created_at_ms, r.run_id))]
    assert set(page["runs"][0]) == fields | {"state"}
    assert {r.run_id: r.status for r in rows} == {"r-pending": "pending", "r-done": "completed",
                                                   "r-live": "running"}


def test_runs_list_filters_by_status_and_renders_a_table(run_cli, populated):
    result = run_cli("--db", populated, "runs", "list", "--status", "running", "--status", "pending")
    assert result.code == 0, result
    assert "r-live" in result.out and "r-pending" in result.out and "r-done" not in result.out


def test_runs_show_reports_lease_reconfirmed_warnings_and_keeps_the_status(run_cli, populated):
    result = run_cli("--db", populated, "runs", "show", "r-live", "--json")
    assert result.code == 0, result
    detail = json.loads(result.out)
    assert detail["run"]["status"] == "running"
    assert [(w["code"], w["unconfirmed_ms"]) for w in detail["warnings"]] == [("lease-reconfirmed", 19_000)]
    human = run_cli("--db", populated, "runs", "show", "r-live")
    assert "lease-reconfirmed" in human.out and "19000" in human.out


def test_runs_show_of_an_unknown_run_is_one_line(run_cli, populated):
    result = run_cli("--db", populated, "runs", "show", "nope")
    assert result.code == 1 and "not_found_row" in result.err and "Traceback" not in result.err


def test_runs_cancel_records_the_request_and_refuses_settled_runs(run_cli, populated):
    first = run_cli("--db", populated, "runs", "cancel", "r-live", "--json")
    assert first.code == 0, first
    assert json.loads(first.out)["type"] == "CancelRequested"
    again = run_cli("--db", populated, "runs", "cancel", "r-live")
    assert again.code == 0 and "already requested" in again.out
    settled = run_cli("--db", populated, "runs", "cancel", "r-done")
    assert settled.code == 1 and "already settled (completed)" in settled.err and settled.out == ""
    with fencepost.open(populated, readonly=True) as store:
        assert store.runs.get("r-live").cancel_requested_at_ms is not None


def test_journal_show_lists_the_companion_facts(run_cli, populated):
    result = run_cli("--db", populated, "journal", "show", "r-done", "--companion", "--json")
    assert result.code == 0, result
    page = json.loads(result.out)
    assert [e["event_type"] for e in page["entries"]] == [
        "flows.consensus.claimed", "flows.consensus.activated", "flows.consensus.released"]
    own = run_cli("--db", populated, "journal", "show", "r-live")
    assert own.code == 0 and "flows.engine.run-decision" in own.out


def test_feed_tail_prints_every_change_once(run_cli, populated):
    result = run_cli("--db", populated, "feed", "tail", "--json")
    assert result.code == 0, result
    changes = json.loads(result.out)
    assert sorted(c["run_id"] for c in changes) == ["r-done", "r-live", "r-pending"]
    revisions = [c["revision"] for c in changes]
    assert revisions == sorted(revisions)


def test_feed_tail_follow_prints_new_changes_until_terminated(run_cli, populated):
    proc = subprocess.Popen([fencepost_exe(), "--db", populated, "feed", "tail", "--follow", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = [json.loads(proc.stdout.readline()) for _ in range(3)]
        assert {c["run_id"] for c in first} == {"r-pending", "r-done", "r-live"}
        with fencepost.open(populated) as store:
            store.runs.create("r-new", "{}")
        nxt = json.loads(proc.stdout.readline())
        assert nxt["run_id"] == "r-new"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err


def test_feed_snapshot_reads_in_request_order(run_cli, populated):
    result = run_cli("--db", populated, "feed", "snapshot", "r-live", "nope", "r-done", "--json")
    assert result.code == 0, result
    batch = json.loads(result.out)
    assert [(s["type"], s["run_id"]) for s in batch["snapshots"]] == [
        ("Observed", "r-live"), ("Missing", "nope"), ("Observed", "r-done")]


def test_feed_snapshot_of_more_than_200_ids_is_a_usage_error(run_cli, populated):
    ok = run_cli("--db", populated, "feed", "snapshot", *[f"r{i}" for i in range(200)], "--json")
    assert ok.code == 0 and len(json.loads(ok.out)["snapshots"]) == 200, ok
    result = run_cli("--db", populated, "feed", "snapshot", *[f"r{i}" for i in range(201)])
    assert result.code == 2 and "at most 200 run ids" in result.err and "decode_failed" not in result.err


def test_a_cursor_that_is_not_this_listings_is_a_usage_error(run_cli, populated):
    garbage = run_cli("--db", populated, "runs", "list", "--cursor", "garbage")
    assert garbage.code == 2 and "invalid_cursor" in garbage.err, garbage
    cursor = json.loads(run_cli("--db", populated, "runs", "list", "--limit", "1", "--json").out)["next_cursor"]
    assert cursor is not None
    other_order = run_cli("--db", populated, "runs", "list", "--desc", "--cursor", cursor)
    assert other_order.code == 2 and "other order" in other_order.err, other_order


def test_source_show_and_rotate(run_cli, populated):
    before = json.loads(run_cli("--db", populated, "source", "show", "--json").out)
    rotated = run_cli("--db", populated, "source", "rotate", "--json")
    assert rotated.code == 0, rotated
    after = json.loads(run_cli("--db", populated, "source", "show", "--json").out)
    assert after["source"] != before["source"] and after["source"] == json.loads(rotated.out)["source"]


def test_projection_run_status_and_rebuild(run_cli, populated):
    ran = run_cli("--db", populated, "projection", "run", "--json")
    assert ran.code == 0, ran
    assert json.loads(ran.out)["applied"] == 3
    status = json.loads(run_cli("--db", populated, "projection", "status", "--json").out)
    assert status["lag"] == 0 and status["name"] == "runs_by_status"
    rebuilt = run_cli("--db", populated, "projection", "rebuild", "--json")
    assert rebuilt.code == 0 and json.loads(rebuilt.out)["rebuilt"] is True
    history = run_cli("--db", populated, "projection", "run", "--name", "ownership-history", "--json")
    assert history.code == 0, history


def test_init_creates_and_migrates_then_reads_work(run_cli, tmp_path):
    db = tmp_path / "fresh" / "f.db"
    result = run_cli("--db", f"sqlite:///{db}", "init")
    assert result.code == 0 and db.exists(), result
    listed = run_cli("--db", f"sqlite:///{db}", "runs", "list", "--json")
    assert listed.code == 0 and json.loads(listed.out)["runs"] == []


def test_init_uses_the_default_path_in_the_working_directory(run_cli, tmp_path):
    assert run_cli("init", cwd=tmp_path).code == 0
    assert (tmp_path / ".flows" / "flows.db").exists()


def test_fencepost_db_env_var_selects_the_database(run_cli, populated):
    result = run_cli("runs", "list", "--json", env={"FENCEPOST_DB": populated})
    assert result.code == 0 and len(json.loads(result.out)["runs"]) == 3


def test_worker_command_settles_every_pending_run(run_cli_subprocess, db_url):
    run_cli = run_cli_subprocess  # worker processes: started from a process of their own
    with fencepost.open(db_url) as store:
        for i in range(12):
            store.runs.create(f"w{i:02d}", '{"steps": 1}')
    started = time.monotonic()
    result = run_cli("--db", db_url, "worker", "-n", "2", "--concurrency", "3",
                     "--task", "fencepost.cli.demo:demo_task", "--until-idle", timeout=90)
    assert result.code == 0, result
    assert time.monotonic() - started < 60
    with fencepost.open(db_url, readonly=True) as store:
        assert {store.runs.get(f"w{i:02d}").status for i in range(12)} == {"completed"}


def test_worker_command_on_sigterm_parks_runs_in_hand_as_suspended(db_url, tmp_path):
    with worker_holding_runs(db_url, tmp_path, [f"s{i}" for i in range(3)], "-n", "1", "--concurrency", "3") as proc:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    with fencepost.open(db_url, readonly=True) as store:
        rows = [store.runs.get(f"s{i}") for i in range(3)]
    assert {r.status for r in rows} == {"suspended"} and all(r.owner is None for r in rows)


def test_python_dash_m_fencepost_runs_the_command(tmp_path):
    """``python -m fencepost`` had no ``__main__`` ("No module named fencepost.__main__"): where the
    console script is not on PATH there was no way to run the CLI."""
    import sys

    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    ok = subprocess.run([sys.executable, "-m", "fencepost", "--db", f"sqlite:///{tmp_path / 'm.db'}", "init"],
                        capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0 and (tmp_path / "m.db").exists(), ok
    bad = subprocess.run([sys.executable, "-m", "fencepost", "no-such-command"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert bad.returncode == 2 and "No such command" in bad.stderr, bad


def test_a_second_projection_builder_is_told_to_stop_the_first(run_cli, db_url):
    """``projection rebuild`` while another builder held the name said only "another builder is
    applying this projection name on this target": no name, no target, nothing to do about it."""
    import fencepost
    from fencepost.projections import ProjectionBuilder, RunsByStatus

    assert run_cli("--db", db_url, "init").code == 0
    store = fencepost.open(db_url)
    holder = ProjectionBuilder(store, db_url, RunsByStatus())
    try:
        holder.catch_up()
        for command in (["projection", "rebuild"], ["projection", "run"]):
            result = run_cli("--db", db_url, *command)
            assert result.code == 1, result
            assert len(result.err.strip().splitlines()) == 1, result
            assert "runs_by_status" in result.err and "stop" in result.err, result
            assert "projection run --follow" in result.err, result
    finally:
        holder.close()
        store.close()


def test_feed_tail_resumes_from_a_source_and_revision_and_refuses_another_source(run_cli, populated, tmp_path):
    """Defect (downstream tailer): ``--from`` took a revision alone, "of the current source". A
    tailer that saved where it stopped (every change prints its ``source`` and ``revision``) and
    resumed after the database was restored or rotated, or pointed at another database, got the
    new source's changes after that revision with exit 0: the rotation it must rebuild on went
    unnoticed, and changes were skipped. ``--from SOURCE:REVISION`` resumes there on the same
    source and exits 1 saying the source changed otherwise, before printing anything."""
    changes = [json.loads(line) for line in
               run_cli("--db", populated, "feed", "tail", "--format", "jsonl").out.splitlines()]
    mid = changes[1]
    resumed = run_cli("--db", populated, "feed", "tail", "--from", f"{mid['source']}:{mid['revision']}",
                      "--format", "jsonl")
    assert resumed.code == 0, resumed
    assert [json.loads(line) for line in resumed.out.splitlines()] == changes[2:]
    # An upper-case source is the same source.
    same = run_cli("--db", populated, "feed", "tail", "--from", f"{mid['source'].upper()}:{mid['revision']}")
    assert same.code == 0, same
    rotated = json.loads(run_cli("--db", populated, "source", "rotate", "--json").out)
    after = run_cli("--db", populated, "feed", "tail", "--from", f"{mid['source']}:{mid['revision']}",
                    "--format", "jsonl")
    assert_one_line_error(after)
    assert after.code == 1 and after.out == "", after
    assert mid["source"] in after.err and rotated["source"] in after.err and "--from 0" in after.err, after
    # A source that is not 32 hex digits is a usage error naming the option.
    for bad in ("abc:1", f"{mid['source']}:", f"{mid['source']}x:1"):
        refused = run_cli("--db", populated, "feed", "tail", "--from", bad)
        assert_one_line_error(refused)
        assert refused.code == 2 and "--from" in refused.err, refused


def test_feed_tail_help_names_the_formats_that_print_the_source_to_resume_from(run_cli, populated):
    """``--from SOURCE:REVISION`` said "the source and revision a change printed", and the change
    feed page "of the last change it printed"; the default table prints a change's revision and run
    id, never its source, so a tailer reading the table had no SOURCE to give. The help and the page
    now say which formats print it (json, jsonl, csv) and where else to find it (``source show``);
    each of those formats does print it, and resuming from what it printed works."""
    from fencepost.cli import cli
    from tests._docs import DOCS

    source = json.loads(run_cli("--db", populated, "source", "show", "--json").out)["source"]
    table = run_cli("--db", populated, "feed", "tail")
    assert table.code == 0 and table.out and source not in table.out, table
    tail = cli.commands["feed"].commands["tail"]  # type: ignore[attr-defined]
    words = " ".join(next(p.help for p in tail.params if p.name == "starts").split())
    assert "a change printed" not in words and "as json, jsonl and csv print them" in words, words
    assert "source show" in words, words
    page = " ".join((DOCS / "concepts" / "change-feed.md").read_text(encoding="utf-8").split())
    assert "(`--format jsonl`, `json` and `csv` print both; the table shows the revision alone" in page
    for fmt in ("json", "jsonl", "csv"):
        out = run_cli("--db", populated, "feed", "tail", "--format", fmt).out
        if fmt == "json":
            last = json.loads(out)[-1]
        elif fmt == "jsonl":
            last = json.loads(out.splitlines()[-1])
        else:
            lines = out.splitlines()
            last = dict(zip(lines[0].split(","), lines[-1].split(","), strict=True))
        assert last["source"] == source, (fmt, out)
        resumed = run_cli("--db", populated, "feed", "tail", "--from", f"{last['source']}:{last['revision']}")
        assert (resumed.code, resumed.out) == (0, ""), (fmt, resumed)


def test_a_projection_that_applied_nothing_shows_no_source_like_one_never_built(run_cli, db_url):
    """``projection run --name ownership_history`` on a store with no ownership fact yet applied
    nothing, yet recorded the current source id: ``projection status`` then showed that id as the
    source the read model reflects, where runs_by_status never built showed ``-``. Both show no
    source (``-``, null, empty) until something was applied, in every output format."""
    assert run_cli("--db", db_url, "init").code == 0
    assert run_cli("--db", db_url, "runs", "create", "r1").code == 0
    assert run_cli("--db", db_url, "projection", "run", "--name", "ownership_history").code == 0
    for name in ("runs_by_status", "ownership_history"):
        shown = run_cli("--db", db_url, "projection", "status", "--name", name, "--json")
        assert shown.code == 0, shown
        status = json.loads(shown.out)
        assert status["source"] is None and status["applied_revision"] == 0, (name, status)
        assert status["lag"] == status["source_revision"], (name, status)
        table = run_cli("--db", db_url, "projection", "status", "--name", name)
        assert [line.split() for line in table.out.splitlines() if line.startswith("source ")] == \
            [["source", "-"]], (name, table)
        csv = run_cli("--db", db_url, "projection", "status", "--name", name, "--format", "csv").out.splitlines()
        assert dict(zip(csv[0].split(","), csv[1].split(","), strict=True))["source"] == "", (name, csv)
    # Once something is applied, the source is the one the projection reflects.
    with fencepost.open(db_url) as store:
        store.runs.claim_and_own("r1", store.runs.get("r1"), OwnerId("h", 1, "n"), store.clock.now_ms())
    assert run_cli("--db", db_url, "projection", "run", "--name", "ownership_history").code == 0
    status = json.loads(run_cli("--db", db_url, "projection", "status", "--name", "ownership_history", "--json").out)
    assert status["source"] == status["current_source"] and status["applied_revision"] > 0, status
