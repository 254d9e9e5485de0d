"""``fencepost worker`` says which of its processes died, and how, when one is killed (SIGKILL).

Defect: the command printed only "1 worker process(es) exited abnormally": an operator running
several processes could not tell which one died, nor that it was killed rather than crashed. Now
it names each such process by pid and says the signal that ended it (or its exit code).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

import fencepost
from tests.cli.conftest import fencepost_exe

pytestmark = pytest.mark.slow


def test_a_killed_worker_process_is_named_with_its_pid_and_signal(db_url, tmp_path):
    (tmp_path / "slowtasks.py").write_text(
        "import time\n"
        "def work(ctx):\n"
        "    ctx.checkpoint({'started': True})\n"
        "    while True:\n"
        "        ctx.check()\n"
        "        time.sleep(0.01)\n"
    )
    with fencepost.open(db_url) as store:
        store.runs.create("k0", "{}")
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.Popen([fencepost_exe(), "--db", db_url, "worker", "-n", "1", "--task", "slowtasks:work"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        with fencepost.open(db_url, readonly=True) as store:
            while (row := store.runs.get("k0")).state_json != '{"started":true}':
                assert time.monotonic() < deadline, "the worker never started the run"
                time.sleep(0.05)
        assert row.owner is not None
        victim = row.owner.pid
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    said = " ".join((out + err).split())
    assert f"worker process {victim} was killed by SIGKILL" in said, out + err
    assert "Traceback" not in err
