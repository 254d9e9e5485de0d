"""``stop_workers`` leaves no worker process behind, even when Ctrl-C cuts its waits short."""

from __future__ import annotations

import multiprocessing
import signal
import time
from typing import Any

import pytest

from fencepost.cli.worker import stop_workers


def _deaf(ready: Any) -> None:
    # A worker busy in code that ignores SIGTERM: only SIGKILL ends it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ready.set()
    while True:
        time.sleep(0.05)


class _CtrlCDuringJoin:
    """A real process whose ``join`` is interrupted by Ctrl-C the first time it is called after it
    was killed: the user pressing Ctrl-C again while ``stop_workers`` waits for a killed worker."""

    def __init__(self, process: multiprocessing.Process) -> None:
        self.process = process
        self.killed = False
        self.interrupted = False

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def terminate(self) -> None:
        self.process.terminate()

    def kill(self) -> None:
        self.killed = True
        self.process.kill()

    def join(self, timeout: float | None = None) -> None:
        if self.killed and not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        self.process.join(timeout)


def test_a_ctrl_c_while_waiting_for_a_killed_worker_still_kills_every_other_worker():
    """Three workers that ignore SIGTERM; the grace runs out, and a Ctrl-C lands while the first
    killed one is waited for. Every worker must still be killed: before, the ones after it were
    never sent SIGKILL and kept running (the interpreter then waited for them at exit)."""
    ctx = multiprocessing.get_context("spawn")
    ready = [ctx.Event() for _ in range(3)]
    procs = [ctx.Process(target=_deaf, args=(r,), daemon=True) for r in ready]
    for p in procs:
        p.start()
    wrapped = [_CtrlCDuringJoin(p) for p in procs]
    try:
        assert all(r.wait(30.0) for r in ready)  # each ignores SIGTERM before it is sent
        with pytest.raises(KeyboardInterrupt):
            stop_workers(wrapped, grace=0.2)
        for p in procs:
            p.join(5.0)
        assert [p.exitcode for p in procs] == [-signal.SIGKILL] * 3
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
