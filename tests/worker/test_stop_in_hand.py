"""A stop never strands a run the worker took but had not started yet.

Defect: ``Worker.run`` takes a run (claim, activate, hold) and submits its function to its thread
pool; a run submitted just before the stop, still queued for a thread when it came, was dropped by
the pool's shutdown (``cancel_futures``) and forgotten. ``run()`` returned (the CLI exited 0) with
the run ``running`` under the stopped worker, its state untouched, its journal ``claimed`` and
``activated`` only, and nobody renewing its lease: no peer could take it for the whole lease
(30 s; never, under a clock that stands still). Now, once the worker stops, a run whose function no
thread has started is given back at once (parked ``suspended`` from its last checkpoint, its journal
``claimed``, ``activated``, ``released``), never run, and counted ``suspended``.

The first test makes the window deterministic: the pool's threads wait at a gate before taking
their first run, so every run the worker takes stays queued; the stop comes while they wait. The
second repeats real stops at random moments of a busy worker for a few seconds. Both backends, a
single store and a shard set. The third holds a pool thread that has taken a run before it calls the
function: the stop parks that run too, its function never called.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencepost
import fencepost.worker as worker_module
from fencepost.clock import ManualClock
from fencepost.journal import companion_stream
from fencepost.worker import Worker, WorkerStats
from tests.worker.conftest import run_in_thread, wait_for

BOUND_S = 10  # generous bound on every wait; a stranded run never becomes claimable within it


@pytest.fixture(params=["store", "shards"])
def target(request: pytest.FixtureRequest, make_db_url) -> Iterator[Any]:
    """A store, or a shard set of two members, on the test's backend, under a clock standing still
    (a run left ``running`` is then never claimable again by a lapse: only a give-back frees it)."""
    if request.param == "store":
        opened: Any = fencepost.open(make_db_url(), clock=ManualClock(0))
    else:
        opened = fencepost.open_shards([make_db_url(), make_db_url()], clock=ManualClock(0))
    try:
        yield opened
    finally:
        opened.close()


def _store_of(target: Any, run_id: str) -> Any:
    store_for = getattr(target, "store_for", None)
    return store_for(run_id) if store_for is not None else target


def _facts(target: Any, run_id: str) -> list[str]:
    page = _store_of(target, run_id).journal.entries(companion_stream(run_id))
    return [e.event_type.rsplit(".", 1)[-1] for e in page.entries]


def _gate_the_pool(monkeypatch: pytest.MonkeyPatch, gate: threading.Event) -> None:
    """The worker's pool threads wait at ``gate`` (up to ``BOUND_S``) before taking their first run."""
    real = worker_module.ThreadPoolExecutor

    def make(*args: Any, **kwargs: Any) -> Any:
        return real(*args, initializer=gate.wait, initargs=(BOUND_S,), **kwargs)

    monkeypatch.setattr(worker_module, "ThreadPoolExecutor", make)


def test_runs_taken_but_not_started_are_given_back_at_the_stop(target, monkeypatch):
    ids = [f"r{i:02d}" for i in range(10)]
    for r in ids:
        target.runs.create(r, '{"n": 0}')
    ran: list[str] = []
    worker = Worker(target, lambda ctx: ran.append(ctx.run_id), concurrency=3)
    gate = threading.Event()
    _gate_the_pool(monkeypatch, gate)
    stop = threading.Event()
    t, outcome = run_in_thread(worker, stop)
    try:
        # Three runs taken (claimed, activated, held) and queued for the pool's gated threads.
        assert wait_for(lambda: worker.stats.claimed == 3, BOUND_S), worker.stats
        taken = [r for r in ids if target.runs.get(r).status == "running"]
        assert len(taken) == 3, taken
        stop.set()
        # Given back at once: while the pool's threads still wait, before any run finishes.
        given_back = wait_for(lambda: all(target.runs.get(r).status != "running" for r in taken), BOUND_S / 2)
        stranded = [(r, target.runs.get(r).status) for r in taken]
    finally:
        gate.set()
        t.join(BOUND_S)
    assert given_back, f"runs taken before the stop were left running under the stopped worker: {stranded}"
    assert not t.is_alive(), "run() did not return after the stop"
    assert outcome and isinstance(outcome[0], WorkerStats), outcome
    stats = outcome[0]
    assert ran == [], "a run whose function had not started when the stop came was run anyway"
    assert (stats.claimed, stats.suspended, stats.completed) == (3, 3, 0), stats
    for r in taken:
        row = target.runs.get(r)
        assert (row.status, row.owner, row.claimant, row.state_json) == ("suspended", None, None, '{"n": 0}'), row
        assert _facts(target, r) == ["claimed", "activated", "released"], (r, _facts(target, r))
    for r in set(ids) - set(taken):  # nothing new was taken
        assert target.runs.get(r).status == "pending"
    # A peer takes every run at once: the clock stands still, so a run left running would never be.
    peer = Worker(target, lambda ctx: None, concurrency=1)
    assert sorted(row.run_id for row in peer.take(len(ids))) == ids


def _checkpointing(ctx):
    state = dict(ctx.state)
    for i in range(state.get("done", 0), 3):
        ctx.check()
        time.sleep(0.01)
        state["done"] = i + 1
        ctx.checkpoint(state)
    return state


@pytest.mark.parametrize("layout", ["store", "shards"])
def test_a_stop_at_any_moment_leaves_no_run_running(layout, make_db_url):
    """Real stops at random moments of a worker busy with short runs (a few seconds in all): when
    ``run()`` returns, every run is settled, parked ``suspended`` or still ``pending``, none
    ``running``, and what it counts adds up to what it took."""
    if layout == "store":
        target: Any = fencepost.open(make_db_url())
    else:
        target = fencepost.open_shards([make_db_url(), make_db_url()])
    rng = random.Random()
    try:
        end = time.monotonic() + 3.0
        trial = 0
        while trial < 3 or (time.monotonic() < end and trial < 12):
            ids = [f"t{trial}-{i:03d}" for i in range(40)]
            for r in ids:
                target.runs.create(r, '{"done": 0}')
            worker = Worker(target, _checkpointing, concurrency=4, run_prefix=f"t{trial}-")
            stop = threading.Event()
            t, outcome = run_in_thread(worker, stop)
            time.sleep(rng.uniform(0.02, 0.3))
            stop.set()
            stopped_at = time.monotonic()
            t.join(BOUND_S)
            assert not t.is_alive(), f"trial {trial}: run() did not return after the stop"
            assert time.monotonic() - stopped_at < 5, f"trial {trial}: run() took too long to return"
            assert outcome and isinstance(outcome[0], WorkerStats), outcome
            rows = [target.runs.get(r) for r in ids]
            left = [(r.run_id, r.status, _facts(target, r.run_id)) for r in rows if r.status == "running"]
            assert not left, f"trial {trial}: run() returned with runs left running under it: {left}"
            for row in rows:
                assert row.status in ("completed", "suspended", "pending"), row
                if row.status != "completed":
                    assert row.owner is None and row.claimant is None, row
            stats = outcome[0]
            ended = stats.completed + stats.suspended + stats.failed + stats.cancelled + stats.lost
            assert stats.claimed == ended, (trial, stats)
            assert stats.completed == sum(r.status == "completed" for r in rows), (trial, stats)
            trial += 1
    finally:
        target.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_run_a_thread_took_as_the_stop_came_is_parked_not_run(make_db_url):
    """The narrower window: a thread of the pool has taken the run (too late to take it out of the
    pool) but its function was not called yet when the stop came. It is parked ``suspended`` from
    its last checkpoint, as at a ``check()``, and its function never called."""
    with fencepost.open(make_db_url(), clock=ManualClock(0)) as store:
        store.runs.create("r1", '{"n": 0}')
        ran: list[str] = []
        worker = Worker(store, lambda ctx: ran.append(ctx.run_id), concurrency=1)
        entered, release = threading.Event(), threading.Event()
        real_execute = worker._execute

        def execute(ctx):  # on the pool's thread, before the worker's own execution begins
            entered.set()
            release.wait(BOUND_S)
            return real_execute(ctx)

        worker._execute = execute
        stop = threading.Event()
        t, outcome = run_in_thread(worker, stop)
        try:
            assert entered.wait(BOUND_S)
            stop.set()
            assert wait_for(worker._stopping.is_set, BOUND_S)
        finally:
            release.set()
            t.join(BOUND_S)
        assert not t.is_alive() and outcome and isinstance(outcome[0], WorkerStats), outcome
        assert ran == []
        row = store.runs.get("r1")
        assert (row.status, row.owner, row.state_json) == ("suspended", None, '{"n": 0}'), row
        assert _facts(store, "r1") == ["claimed", "activated", "released"]
        assert (outcome[0].claimed, outcome[0].suspended) == (1, 1), outcome[0]
