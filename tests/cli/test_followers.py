"""The long-running read commands: ``feed tail --follow`` and ``projection run --follow``.

Each is the real console script in a subprocess: Ctrl-C (SIGINT) stops it gracefully with exit 130,
SIGTERM with 0, and ``projection run --follow`` prints a status line (position, lag, applied/s).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

import fencepost
from tests.cli.conftest import fencepost_exe

STATUS_LINE = re.compile(r"^runs_by_status  position (?:[0-9a-f]{8}|-):(\d+)  lag (\d+)  applied/s (\d+\.\d)")


def _like_a_terminal() -> None:
    # A shell starts background jobs with SIGINT ignored (and the command then keeps ignoring it);
    # start the command as a terminal's foreground job, with SIGINT at its default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    return subprocess.Popen([fencepost_exe(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=_like_a_terminal)


def _stop(proc: subprocess.Popen, sig: int) -> tuple[int, str, str]:
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)], ids=["ctrl-c", "sigterm"])
def test_feed_tail_follow_stops_on_a_signal_with_the_documented_exit_code(three_runs, sig, code):
    proc = _start("--db", three_runs, "feed", "tail", "--follow", "--format", "jsonl")
    try:
        first = [json.loads(proc.stdout.readline()) for _ in range(3)]
        assert [c["run_id"] for c in first] == ["r1", "r2", "r3"]
        with fencepost.open(three_runs) as store:
            store.runs.create("r4", "{}")
        assert json.loads(proc.stdout.readline())["run_id"] == "r4"
    finally:
        returncode, _out, err = _stop(proc, sig)
    assert returncode == code, err
    assert "Traceback" not in err


@pytest.mark.slow
def test_feed_tail_follow_in_a_table_prints_one_plain_line_per_change(three_runs):
    proc = _start("--db", three_runs, "feed", "tail", "--follow")
    try:
        lines = [proc.stdout.readline().split() for _ in range(3)]
    finally:
        returncode, _out, err = _stop(proc, signal.SIGINT)
    assert [line[1:] for line in lines] == [["changed", "r1"], ["changed", "r2"], ["changed", "r3"]]
    assert returncode == 130, err


@pytest.mark.slow
def test_projection_run_follow_prints_status_lines_and_exits_130_on_ctrl_c(three_runs):
    proc = _start("--db", three_runs, "projection", "run", "--follow", "--interval", "0.2")
    try:
        deadline = time.monotonic() + 30
        while True:
            line = proc.stdout.readline()
            match = STATUS_LINE.match(line)
            assert match, line
            if int(match.group(2)) == 0:
                break
            assert time.monotonic() < deadline, "the projection never caught up"
        caught_up = int(match.group(1))
        with fencepost.open(three_runs) as store:
            for i in range(5):
                store.runs.create(f"n{i}", "{}")
            head = store.feed.position().revision
        while True:
            match = STATUS_LINE.match(proc.stdout.readline())
            assert match
            if int(match.group(1)) == head and int(match.group(2)) == 0:
                break
            assert time.monotonic() < deadline, "the projection never followed the new runs"
        assert head > caught_up
    finally:
        returncode, _out, err = _stop(proc, signal.SIGINT)
    assert returncode == 130, err
    assert "Traceback" not in err
    with fencepost.open(three_runs, readonly=True) as store:
        from fencepost.projections import ProjectionBuilder, RunsByStatus

        with ProjectionBuilder(store, three_runs, RunsByStatus()) as builder:
            assert builder.status().lag == 0


@pytest.mark.slow
def test_projection_run_follow_in_jsonl_prints_status_objects(three_runs):
    proc = _start("--db", three_runs, "projection", "run", "--follow", "--interval", "0.2", "--format", "jsonl")
    try:
        status = json.loads(proc.stdout.readline())
    finally:
        returncode, _out, err = _stop(proc, signal.SIGTERM)
    assert returncode == 0, err
    assert {"name", "applied_revision", "lag", "applied_per_s"} <= set(status)


def test_projection_name_is_accepted_as_projection_status_shows_it(run_cli, three_runs):
    for dashed in ("runs-by-status", "ownership-history"):
        shown = json.loads(run_cli("--db", three_runs, "projection", "status", "--name", dashed, "--json").out)
        name = shown["name"]
        assert "_" in name
        ran = run_cli("--db", three_runs, "projection", "run", "--name", name, "--json")
        assert ran.code == 0, ran
        status = json.loads(run_cli("--db", three_runs, "projection", "status", "--name", name, "--json").out)
        assert status["name"] == name and status["lag"] == 0
    bad = run_cli("--db", three_runs, "projection", "run", "--name", "nope")
    assert bad.code == 2 and "runs_by_status" in bad.err
    # status takes any projection checkpointed on the target: an unknown name says which ones it has.
    bad = run_cli("--db", three_runs, "projection", "status", "--name", "nope")
    assert bad.code == 1 and "it has ownership_history, runs_by_status" in bad.err, bad


@pytest.mark.slow
def test_feed_tail_follow_ends_with_a_clear_error_when_the_source_rotates(three_runs):
    """A rotated source ended the tailer with the store's internal words ("invalid_run:
    RunStore.changes_with_snapshots: change position belongs to another source: rebuild"). It now
    says the source rotated, names the new source, and says how to start again; exit 1."""
    proc = _start("--db", three_runs, "feed", "tail", "--follow", "--format", "jsonl")
    try:
        assert [json.loads(proc.stdout.readline())["run_id"] for _ in range(3)] == ["r1", "r2", "r3"]
        with fencepost.open(three_runs) as store:
            rotated = store.feed.rotate_source()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "source rotated" in lines[0] and rotated.source in lines[0] and "--from 0" in lines[0], err
    assert "invalid_run" not in err and "Traceback" not in err
