"""``fencepost worker`` processes stop when the command that started them is gone.

Defect: ``kill -9`` of the ``fencepost worker`` command (an operator, the OOM killer, a supervisor
that kills only its main process) left its worker processes running for good, orphaned: they went on
claiming and running runs with nothing left to stop them, print their report or wait for them. Each
now notices within a second that its parent is gone and stops gracefully, as on SIGTERM: the runs in
hand are parked ``suspended`` at their next check, for a new worker to resume. Both backends: the
runs are parked on either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

import fencepost
from tests.cli.conftest import worker_holding_runs

pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_worker_processes_stop_gracefully_when_the_command_is_killed(db_url, tmp_path):
    ids = ["o0", "o1"]
    with worker_holding_runs(db_url, tmp_path, ids, "-n", "2", "--concurrency", "1") as proc:
        with fencepost.open(db_url, readonly=True) as store:
            owners = {store.runs.get(r).owner.pid for r in ids}
        assert owners <= set(_children(proc.pid)), (owners, _children(proc.pid))
        os.kill(proc.pid, signal.SIGKILL)  # the command alone: its processes are not signalled
        proc.wait()
        try:
            deadline = time.monotonic() + 20
            while any(_alive(p) for p in owners):
                assert time.monotonic() < deadline, "the orphaned worker processes kept running"
                time.sleep(0.1)
        finally:
            for p in owners:
                if _alive(p):
                    os.kill(p, signal.SIGKILL)
    with fencepost.open(db_url, readonly=True) as store:
        assert {r: store.runs.get(r).status for r in ids} == dict.fromkeys(ids, "suspended")
