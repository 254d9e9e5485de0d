"""A command started with its standard output closed (``>&-``) is refused before it does anything
(exit 2, one ``Error:`` line), where it used to fail with an internal ``AttributeError`` after
working, or to exit 0 having written nothing; ``runs create -`` with its standard input closed
(``<&-``) is a usage error naming stdin, not an ``AttributeError``. Both backends: the refusal
comes before the store is opened, and the store is unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fencepost

SRC = str(Path(fencepost.__file__).parents[1])


def _run(args: list[str], *, close: int) -> subprocess.CompletedProcess[str]:
    """``python -m fencepost ARGS`` with file descriptor ``close`` (0 or 1) closed in the child."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    r, w = os.pipe()  # stderr, read back; stdout (when kept) goes to the same pipe's sibling
    out_r, out_w = os.pipe()

    def child() -> None:
        os.close(close)

    proc = subprocess.Popen([sys.executable, "-m", "fencepost", *args], stdin=subprocess.DEVNULL if close else None,
                            stdout=out_w, stderr=w, env=env, preexec_fn=child, close_fds=True)
    os.close(w)
    os.close(out_w)
    with os.fdopen(r) as err_f, os.fdopen(out_r) as out_f:
        err = err_f.read()
        out = out_f.read()
    proc.wait(timeout=120)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.parametrize("command", [["runs", "list"], ["source", "show"], ["journal", "replay", "--all"],
                                     ["runs", "create", "closed-out"]])
def test_closed_stdout_is_refused_before_anything_is_done(db_url, command):
    fencepost.open(db_url).close()
    done = _run(["--db", db_url, *command], close=1)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.startswith("Error: standard output is closed"), done.stderr
    assert "Traceback" not in done.stderr and "AttributeError" not in done.stderr
    with fencepost.open(db_url, readonly=True) as store:
        assert store.feed.position().revision == 0  # runs create did not create its run


def test_runs_create_dash_with_stdin_closed_is_a_usage_error(db_url):
    fencepost.open(db_url).close()
    done = _run(["--db", db_url, "runs", "create", "-"], close=0)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "standard input, which is closed" in done.stderr, done.stderr
    assert "AttributeError" not in done.stderr
    with fencepost.open(db_url, readonly=True) as store:
        assert store.feed.position().revision == 0
