"""A worker process SIGKILLed in the middle of its sweep, on both backends.

Covers the pair nothing else did: SIGKILL x worker sweep (the CLI test kills a worker only to see it
named). The killed worker leaves one run ``running`` under its lease and one claimed but not yet
activated. Another worker, once the lease and the claim are stale (a store clock 31 s on), recovers
the claim, takes the running run over, and runs every run exactly once; the journal verifies, the
feed shows every run's settlement, and no run is left claimed or running.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.journal import verify
from fencepost.worker import Worker
from tests.faults.conftest import REPO, Peer

pytestmark = pytest.mark.slow

RUNS = [f"job-{n}" for n in range(5)]


def test_a_worker_killed_mid_sweep_leaves_runs_another_worker_runs_once(db_url: str) -> None:
    with fencepost.open(db_url) as store:
        for run_id in RUNS:
            store.runs.create(run_id, "{}")
        since = store.feed.position()
    proc = subprocess.Popen([sys.executable, "-m", "tests.faults._sweeping", db_url], stdout=subprocess.PIPE, cwd=REPO)
    try:
        reader = Peer.__new__(Peer)  # the peer's bounded line reader on this pipe
        reader.proc, reader._buf = proc, b""
        line = reader._line(60)
        assert line is not None and line.startswith("sweeping "), line
        _, running, claimed = line.split()
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    clock = ManualClock(int(time.time() * 1000) + 31_000)  # the dead worker's lease and claim are stale
    with fencepost.open(db_url, clock=clock) as store:
        assert store.runs.get(running).status == "running"
        assert store.runs.get(claimed).claimant is not None
        calls: Counter[str] = Counter()

        def fn(ctx):
            calls[ctx.run_id] += 1
            return {"done": ctx.run_id}

        stats = Worker(store, fn, concurrency=2).run(until_idle=True)
        assert calls == Counter(dict.fromkeys(RUNS, 1)), calls
        assert (stats.completed, stats.takeovers, stats.lost) == (len(RUNS), 1, 0), stats
        for run_id in RUNS:
            row = store.runs.get(run_id)
            assert (row.status, row.claimant, row.owner) == ("completed", None, None), row
        report = verify(store)
        assert report.ok, report
        settled = {c.run_id for c in store.feed.changes_since(since, limit=100).changes}
        assert settled == set(RUNS)
