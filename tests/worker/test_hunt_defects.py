"""Three worker defects found by a fault hunt, each on both backends.

1. A function that raises ``Cancelled`` itself, with no cancel request on the run: the worker settled
   it ``cancelled`` under the guard that a request is present, the store refused (``GuardFailed``)
   and the worker said nothing, released the lease and left the run ``running``; 30 s later a
   worker took it over and ran the function again, for ever (``until_idle`` never returned). A run
   is never recorded ``cancelled`` without a request, so it now settles ``failed``, its failure
   naming ``Cancelled``, with a warning saying no cancel request was on the run.
2. ``Worker(run_prefix="img-")`` on SQLite also took ``IMG-2`` and ``Img-3``: the prefix was matched
   with ``LIKE``, which ignores ASCII case on SQLite. The prefix now matches case for case, as on
   PostgreSQL.
3. A worker checking liveness by process id (``same_host_pid_probe``) never took back a run left
   ``running`` under its own owner (its function gone after the lease was lost, a settlement that
   failed): its own pid is alive, so the run stayed there and ``until_idle`` waited for ever. The
   worker knows which runs it is executing: a stale run recorded under its own owner that it does
   not hold is taken back (evidence ``lease-expired``), as the lease check would.
"""

from __future__ import annotations

import logging
import threading

import pytest

from fencepost.journal import companion_stream
from fencepost.runstore.liveness import same_host_pid_probe
from fencepost.runstore.outcomes import Claimed
from fencepost.worker import Cancelled, RunContext, Worker
from tests.worker.conftest import run_in_thread, stop_worker, wait_for


def test_a_function_raising_cancelled_without_a_request_settles_failed_not_running_for_ever(store, caplog):
    store.runs.create("abort", "{}")
    calls: list[str] = []

    def fn(ctx: RunContext) -> None:
        calls.append(ctx.run_id)
        raise Cancelled("gave up on its own")

    caplog.set_level(logging.WARNING, logger="fencepost.worker")
    stop = threading.Event()
    thread, outcome = run_in_thread(Worker(store, fn), stop)
    assert wait_for(lambda: store.runs.get("abort").status != "running" and calls, 15), store.runs.get("abort")
    stats = stop_worker(thread, stop, outcome, 20)
    row = store.runs.get("abort")
    assert row.status == "failed" and row.owner is None, row
    assert row.failure is not None and row.failure.type.endswith("Cancelled")
    assert row.failure.message == "gave up on its own"
    assert calls == ["abort"] and stats.failed == 1 and stats.cancelled == 0
    assert any("no cancel request" in r.getMessage() for r in caplog.records), caplog.text


def test_a_function_raising_cancelled_after_a_request_still_settles_cancelled(store):
    store.runs.create("asked", "{}")

    def fn(ctx: RunContext) -> None:
        store.runs.request_cancel("asked", store.clock.now_ms())
        raise Cancelled("asked to")

    stats = Worker(store, fn).run(until_idle=True)
    assert store.runs.get("asked").status == "cancelled" and stats.cancelled == 1


def test_run_prefix_matches_case_for_case(store):
    for run_id in ("img-1", "IMG-2", "Img-3", "imgx-4", "other"):
        store.runs.create(run_id, "{}")
    done: list[str] = []
    stats = Worker(store, lambda ctx: done.append(ctx.run_id), run_prefix="img-").run(until_idle=True)
    assert done == ["img-1"] and stats.completed == 1
    assert {r: store.runs.get(r).status for r in ("IMG-2", "Img-3", "imgx-4", "other")} == dict.fromkeys(
        ("IMG-2", "Img-3", "imgx-4", "other"), "pending")


@pytest.mark.parametrize("liveness", [same_host_pid_probe, None], ids=["pid", "lease"])
def test_a_worker_takes_back_a_stale_run_left_running_under_its_own_owner(store, clock, liveness):
    store.runs.create("left", "{}")
    worker = Worker(store, lambda ctx: {"done": True}, liveness=liveness)
    # The run as a lost lease leaves it: running under this worker's owner, its function gone.
    row = store.runs.get("left")
    claimed = store.runs.claim("left", row.snapshot(), worker.owner, clock.now_ms())
    assert isinstance(claimed, Claimed)
    store.runs.activate("left", worker.owner, claimed.claimed_at_ms, row)
    clock.advance(31_000)  # its heartbeat is stale now
    stop = threading.Event()
    thread, outcome = run_in_thread(worker, stop)
    assert wait_for(lambda: store.runs.get("left").status == "completed", 15), store.runs.get("left")
    stats = stop_worker(thread, stop, outcome, 20)
    assert stats.completed == 1 and stats.takeovers == 1
    evidence = [e for e in store.journal.entries(companion_stream("left")).entries
                if e.event_type.endswith("stolen")]
    assert [e.payload["evidence"] for e in evidence] == ["lease-expired"]
