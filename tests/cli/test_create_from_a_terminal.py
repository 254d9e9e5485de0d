"""``runs create -`` typed at a terminal says it is reading, on SQLite and PostgreSQL.

Run with stdin on a terminal (no pipe, no file), the command waited for input without a word, so a
user who typed ``fencepost runs create -`` to see what it does saw it hang. It now says, on stderr,
that it reads one JSON object a line until Ctrl-D; from a pipe it says nothing.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time

import fencepost
from tests.cli.conftest import fencepost_exe


def _read_until(fd: int, needle: bytes, seconds: float) -> bytes:
    seen, end = b"", time.monotonic() + seconds
    while needle not in seen and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_runs_create_dash_at_a_terminal_says_it_reads_stdin(db_url, run_cli):
    assert run_cli("--db", db_url, "init").code == 0
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.Popen([fencepost_exe(), "--db", db_url, "runs", "create", "-"], stdin=follower,
                            stdout=follower, stderr=follower, env=env)
    os.close(follower)
    try:
        shown = _read_until(leader, b"Ctrl-D", 30)
        assert b"reading runs from stdin" in shown, shown
        os.write(leader, b'{"run_id": "typed"}\n\x04')
        shown += _read_until(leader, b"created 1 run(s)", 30)
        assert proc.wait(timeout=30) == 0, shown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    with fencepost.open(db_url, readonly=True) as store:
        assert store.runs.get("typed").status == "pending"


def test_runs_create_dash_from_a_pipe_says_nothing_more(db_url, run_cli):
    assert run_cli("--db", db_url, "init").code == 0
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.run([fencepost_exe(), "--db", db_url, "runs", "create", "-"], input='{"run_id": "p"}\n',
                          capture_output=True, text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "created 1 run(s)\n", "")
