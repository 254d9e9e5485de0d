"""``fencepost worker`` says it is stopping when asked to stop while a run is still in hand.

A run function that does not call ``check()`` (a long blocking call) keeps the worker running after
Ctrl-C or SIGTERM until it returns. The command used to say nothing meanwhile: after ``^C`` the
terminal sat silent, and a user could not tell a graceful stop in progress from a hang, nor that a
second Ctrl-C kills the processes. Both backends run: the worker holds the run on either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import fencepost
from tests.cli.conftest import fencepost_exe

BLOCKING_TASK = (
    "import os, time\n"
    "def work(ctx):\n"
    "    ctx.checkpoint({'started': True})\n"
    "    while not os.path.exists('release'):  # a blocking call: no ctx.check()\n"
    "        time.sleep(0.02)\n"
    "    return {'done': True}\n"
)


def _like_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(condition, what: str, proc: subprocess.Popen, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert proc.poll() is None, f"the worker exited before {what}"
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize(("how", "code"), [("ctrl-c", 130), ("sigterm", 0)])
def test_a_stop_with_a_run_in_hand_says_so_on_stderr_while_it_waits(db_url, tmp_path: Path, how, code):
    (tmp_path / "blockingtasks.py").write_text(BLOCKING_TASK)
    with fencepost.open(db_url) as store:
        store.runs.create("b0", "{}")
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err_file:
        proc = subprocess.Popen([fencepost_exe(), "--db", db_url, "worker", "-n", "1", "--task", "blockingtasks:work"],
                                stdout=subprocess.PIPE, stderr=err_file, text=True, env=env, cwd=tmp_path,
                                start_new_session=True, preexec_fn=_like_a_terminal)
    try:
        with fencepost.open(db_url, readonly=True) as store:
            _wait_for(lambda: store.runs.get("b0").state_json == '{"started":true}', "the run started", proc)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole group
        else:
            proc.send_signal(signal.SIGTERM)  # a service manager's stop: the command alone
        # While the run is still in hand, the command says what it is waiting for.
        _wait_for(lambda: "stopping" in err_path.read_text(), "a stopping line on stderr", proc)
        text = err_path.read_text()
        assert "runs in hand" in text and "Traceback" not in text and "Error:" not in text, text
        if how == "ctrl-c":
            assert "Ctrl-C again" in text, text
        (tmp_path / "release").touch()
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, (out, err_path.read_text())
    assert "worked" in out
    with fencepost.open(db_url, readonly=True) as store:
        assert store.runs.get("b0").status == "completed"
