"""A follower whose reader goes away (``fencepost feed tail --follow | head -3``) stops, even while
the store is quiet.

A command that only writes when something happens learns that its pipe closed at its next write;
a follower on a quiet store has no next write, so it used to wait for ever after ``head`` had
what it wanted (a script's ``| grep -m1 ID`` hung the same way). Each test reads everything the
command has to say, so it is waiting for the next change (or status line) and writes nothing
more, then closes the pipe: the command must exit 1 (as any command whose output pipe closes)
without a word on stderr. Both backends: the wait for a change is a file watch on SQLite and
LISTEN on PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

import fencepost
from tests.cli.conftest import fencepost_exe

HANG_GUARD_S = 10  # a follower that goes on waiting never exits; a fixed one exits at once


def _start(*args: str) -> tuple[subprocess.Popen, object]:
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.Popen([fencepost_exe(), *args], stdout=write_end, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    os.close(write_end)
    return proc, os.fdopen(read_end, "r")


def _exit_after_reader_leaves(proc: subprocess.Popen, reader) -> tuple[int | None, str]:
    reader.close()
    try:
        _out, err = proc.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _out, err = proc.communicate()
        return None, err
    return proc.returncode, err


@pytest.fixture
def three_runs(db_url):
    with fencepost.open(db_url) as store:
        for run_id in ("r1", "r2", "r3"):
            store.runs.create(run_id, "{}")
    return db_url


@pytest.mark.parametrize("fmt", ["table", "jsonl"])
def test_feed_tail_follow_exits_when_its_reader_closes_the_pipe_on_a_quiet_store(three_runs, fmt):
    proc, reader = _start("--db", three_runs, "feed", "tail", "--follow", "--format", fmt)
    try:
        lines = [reader.readline() for _ in range(3)]  # every change there is: the follower now waits
        assert all("r" + str(i) in line for i, line in enumerate(lines, start=1)), lines
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    code, err = _exit_after_reader_leaves(proc, reader)
    assert code == 1, f"still following {HANG_GUARD_S} s after its reader left" if code is None else err
    assert err == ""


def test_feed_tail_follow_across_stores_exits_when_its_reader_closes_the_pipe(three_runs, make_db_url):
    other = make_db_url()
    fencepost.open(other).close()
    proc, reader = _start("--db", f"a={three_runs}", "--db", f"b={other}", "feed", "tail", "--follow")
    try:
        lines = [reader.readline() for _ in range(3)]
        assert all(line.startswith("a ") for line in lines), lines
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    code, err = _exit_after_reader_leaves(proc, reader)
    assert code == 1, f"still following {HANG_GUARD_S} s after its reader left" if code is None else err
    assert err == ""


def test_projection_run_follow_exits_when_its_reader_closes_the_pipe_between_status_lines(three_runs):
    proc, reader = _start("--db", three_runs, "projection", "run", "--follow", "--interval", "3600")
    try:
        assert reader.readline().startswith("runs_by_status  position")  # the next one is an hour away
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    code, err = _exit_after_reader_leaves(proc, reader)
    assert code == 1, f"still following {HANG_GUARD_S} s after its reader left" if code is None else err
    assert err == ""
