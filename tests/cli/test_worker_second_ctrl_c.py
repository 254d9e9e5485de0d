"""A second Ctrl-C that reaches ``fencepost worker`` while it is saying it stops still gets the summary.

Defect: the first Ctrl-C's handler wrote its "stopping" line outside the guard that turns a
further Ctrl-C into "kill the processes": a second SIGINT arriving while that line was written (a
fast double Ctrl-C, or ``timeout -s INT``, which signals the command and then its process group)
escaped, and the command exited 130 with no stopping line and no table, 3 times in 10 in a
reviewer's runs; here, where only the command is signalled, it never exited (its worker process,
never told to stop, kept it waiting at exit). Here the line is made slow to write (a
``sitecustomize`` wraps it in the command's process), so the second SIGINT surely lands while it
is written.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import fencepost
from tests.cli.conftest import worker_holding_runs

SLOW_SAY = """\
import sys, time
if '--multiprocessing-fork' not in sys.argv:
    import fencepost.cli.worker
    _worker = sys.modules['fencepost.cli.worker']  # the package's ``worker`` attribute is the command
    _said = _worker._say
    def _slow_say(line):
        if line.startswith('stopping'):
            open({flag!r}, 'w').close()
            time.sleep(1.0)
        _said(line)
    _worker._say = _slow_say
"""


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_stop_is_announced_kills_and_still_prints_the_summary(
        db_url, tmp_path, monkeypatch):
    hold = tmp_path / "hold"
    hold.mkdir()
    flag = tmp_path / "saying"
    (hold / "sitecustomize.py").write_text(SLOW_SAY.format(flag=str(flag)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hold), os.environ.get("PYTHONPATH", "")]))
    with worker_holding_runs(db_url, tmp_path, ["d0", "d1"], "-n", "1",
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as proc:
        os.kill(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + 20
        while not flag.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the stop was never announced"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGINT)  # while the stopping line is being written
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    # (The stopping line itself was cut short by the second Ctrl-C here: it is slow to write on purpose.)
    assert "pid" in out and "state" in out  # the summary table
    # The second Ctrl-C means "kill": the worker process was killed, its runs left to their leases.
    with fencepost.open(db_url, readonly=True) as store:
        assert {store.runs.get(r).status for r in ("d0", "d1")} <= {"running", "suspended"}
