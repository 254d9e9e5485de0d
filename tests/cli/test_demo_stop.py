"""``fencepost demo`` stops the way operators expect: Ctrl-C exits 130 with its workers stopped, and
a demo that runs out of --timeout says so and exits non-zero."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from tests.cli.conftest import fencepost_exe


def _like_a_terminal() -> None:
    # A shell starts background jobs with SIGINT ignored, and Python then installs no Ctrl-C handler;
    # start the command the way a terminal does, with SIGINT at its default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_ctrl_c_stops_the_demo_and_its_workers_with_exit_130(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    env["COLUMNS"] = "200"
    proc = subprocess.Popen([fencepost_exe(), "demo", "--runs", "2000", "--workers", "2", "--speed", "2",
                             "--timeout", "300"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_like_a_terminal)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        for line in proc.stdout:  # type: ignore[union-attr]
            m = re.search(r"started \d+ worker processes: pids ([\d, ]+)", line)
            if m:
                pids = [int(p) for p in m.group(1).split(",")]
                break
            assert time.monotonic() < deadline, "the demo never started its workers"
        assert pids, "the demo never printed its worker pids"
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    assert "Error" not in err, "Ctrl-C is the user's stop, not an error: no Error: line"
    assert not [p for p in pids if _alive(p)]


@pytest.mark.slow
def test_a_demo_that_hits_its_timeout_says_so_and_fails(run_cli, tmp_path):
    result = run_cli("demo", "--runs", "3000", "--workers", "2", "--speed", "1", "--timeout", "5",
                     cwd=tmp_path, timeout=240)
    assert result.code == 1, result
    assert "timed out after 5 s" in result.err and "unsettled" in result.err
    assert "Traceback" not in result.err
    # Why no worker was killed: the time ran out first (it said none held a run once a fifth had
    # settled, which had not happened).
    assert "SIGKILLed" in result.out or "stopped before a fifth of the runs had settled" in result.out, result.out
    assert "none held a run once a fifth" not in result.out, result.out


@pytest.mark.slow
def test_a_demo_whose_last_runs_settle_as_its_timeout_passes_is_not_called_timed_out(db_url, tmp_path,
                                                                                  monkeypatch, capsys):
    """The deadline passed while the loop still saw a run unsettled, and that run settled before the
    workers were stopped (a loaded machine, a slow PostgreSQL): every run settled and every check
    passed, so the demo succeeds; it printed 'timed out ... with 0 of N run(s) unsettled', exit 1."""
    import importlib

    from fencepost.cli import main

    demo_module = importlib.import_module("fencepost.cli.demo")  # the module, not the command

    real_counts, real_workers = demo_module._status_counts, demo_module._workers
    stopped = []

    def counts(store, prefix):  # until the workers are stopped, the loop sees one settled run fewer
        found = real_counts(store, prefix)
        if not stopped and found["completed"]:
            found["completed"] -= 1
            found["running"] += 1
        return found

    @contextmanager
    def workers(*args, **kwargs):
        with real_workers(*args, **kwargs) as procs:
            yield procs
        stopped.append(True)

    # The demo's clock: the deadline passes as soon as every run has really settled (the loop still
    # sees one unsettled), rather than after waiting out the whole --timeout.
    real_monotonic = time.monotonic
    jump: list[float] = []

    def monotonic() -> float:
        return real_monotonic() + (jump[0] if jump else 0.0)

    def counts_then_deadline(store, prefix):
        real = real_counts(store, prefix)
        if not stopped and not jump and sum(real[s] for s in demo_module.TERMINAL) >= 20:
            jump.append(1000.0)
        return counts(store, prefix)

    monkeypatch.setattr(demo_module, "time", SimpleNamespace(monotonic=monotonic, time_ns=time.time_ns,
                                                             sleep=time.sleep, time=time.time))
    monkeypatch.setattr(demo_module, "_status_counts", counts_then_deadline)
    monkeypatch.setattr(demo_module, "_workers", workers)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["--db", db_url, "demo", "--runs", "20", "--workers", "2", "--speed", "50", "--timeout", "40"])
    err = capsys.readouterr().err
    assert stopped, "the demo never stopped its workers"
    assert "timed out" not in err and exited.value.code in (0, None), err
