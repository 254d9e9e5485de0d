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
from collections.abc import Callable
from typing import Any

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


def _exits_when_its_reader_leaves(args: tuple[str, ...], read: Callable[[Any], None]) -> None:
    """Start ``fencepost *args`` writing into a pipe, let ``read(reader)`` read (and check) what it
    wrote so far, then close the reader: the follower must exit 1 at once, saying nothing."""
    proc, reader = _start(*args)
    try:
        read(reader)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    reader.close()
    try:
        _out, err = proc.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"still following {HANG_GUARD_S} s after its reader left") from None
    assert proc.returncode == 1, err
    assert err == ""


@pytest.mark.parametrize("fmt", ["table", "jsonl"])
def test_feed_tail_follow_exits_when_its_reader_closes_the_pipe_on_a_quiet_store(three_runs, fmt):
    def read(reader):
        lines = [reader.readline() for _ in range(3)]  # every change there is: the follower now waits
        assert all("r" + str(i) in line for i, line in enumerate(lines, start=1)), lines

    _exits_when_its_reader_leaves(("--db", three_runs, "feed", "tail", "--follow", "--format", fmt), read)


def test_feed_tail_follow_across_stores_exits_when_its_reader_closes_the_pipe(three_runs, make_db_url):
    other = make_db_url()
    fencepost.open(other).close()

    def read(reader):
        lines = [reader.readline() for _ in range(3)]
        assert all(line.startswith("a ") for line in lines), lines

    _exits_when_its_reader_leaves(("--db", f"a={three_runs}", "--db", f"b={other}", "feed", "tail", "--follow"), read)


def test_projection_run_follow_exits_when_its_reader_closes_the_pipe_between_status_lines(three_runs):
    def read(reader):
        assert reader.readline().startswith("runs_by_status  position")  # the next one is an hour away

    _exits_when_its_reader_leaves(("--db", three_runs, "projection", "run", "--follow", "--interval", "3600"), read)
