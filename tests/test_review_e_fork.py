"""Defect (found by a review, SQLite and PostgreSQL): a run function that forks, with the usual
idiom ``if os.fork() == 0: ...; sys.exit(0)``, let the child settle the parent's run ``failed`` with
``SystemExit`` under the parent's owner identity (the parent's own result was then fenced out), and
the child never exited: it went back to waiting in the worker's thread pool, an orphan for ever.

Now the process that took the run is the only one that writes for it: in a forked child, however the
function ends there, nothing is written and the child process ends (``sys.exit``'s code; 1 for an
exception, printed to stderr as Python prints one; 0 for a return). The parent's result stands.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

import fencepost
from fencepost.worker import RunContext, Worker


def _reap(pid: int, timeout: float) -> int | None:
    """The child's exit status once it ended within ``timeout`` s; None (and the child killed) if not."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _child_exits(code: int) -> None:
    sys.exit(code)


def _child_raises(code: int) -> None:
    raise ValueError("raised in the child")


def _child_returns(code: int) -> None:
    return None


@pytest.mark.parametrize(("ending", "expected"), [(_child_exits, 3), (_child_raises, 1), (_child_returns, 0)],
                         ids=["sys.exit", "raise", "return"])
def test_a_forked_child_writes_nothing_and_ends_and_the_parents_result_stands(db_url, ending, expected):
    with fencepost.open(db_url) as store:
        store.runs.create("r1", "{}")
        statuses: list[int | None] = []
        parent = os.getpid()

        def fn(ctx: RunContext):
            pid = os.fork()
            if pid == 0:
                ending(3)
                return {"from": "child"}
            statuses.append(_reap(pid, 10))
            return {"from": "parent"}

        stats = Worker(store, fn, concurrency=1).run(until_idle=True)
        assert os.getpid() == parent, "the child came back out of the worker"
        row = store.runs.get("r1")
        assert (row.status, row.state_json, row.failure) == ("completed", '{"from":"parent"}', None)
        assert (stats.completed, stats.failed, stats.lost) == (1, 0, 0)
        assert statuses == [expected], "the child did not end with the expected status"
