"""``fencepost worker`` says which of its processes died, and how, when one is killed (SIGKILL).

Defect: the command printed only "1 worker process(es) exited abnormally": an operator running
several processes could not tell which one died, nor that it was killed rather than crashed. Now
it names each such process by pid and says the signal that ended it (or its exit code).
"""

from __future__ import annotations

import os
import signal

import pytest

import fencepost
from tests.cli.conftest import worker_holding_runs

pytestmark = pytest.mark.slow


def test_a_killed_worker_process_is_named_with_its_pid_and_signal(db_url, tmp_path):
    with worker_holding_runs(db_url, tmp_path, ["k0"], "-n", "1") as proc:
        with fencepost.open(db_url, readonly=True) as store:
            row = store.runs.get("k0")
        assert row.owner is not None
        victim = row.owner.pid
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    said = " ".join((out + err).split())
    assert f"worker process {victim} was killed by SIGKILL" in said, out + err
    assert "Traceback" not in err
