"""Defect (found by a review, SQLite and PostgreSQL): a store clock that stepped backwards (an NTP
correction) silenced a live worker for as long as the step. Its heartbeats, its lease-deadline checks
and its cancel polling were all paced on the store's wall clock, so after a 60 s step back nothing
was due for 60 s: the stored heartbeat stood still (a peer could take the run), and a cancel request
went unseen. Now they are paced on time that never runs backwards (``fencepost.clock.Steady``): a
backward step counts as the real time that passed, and the store clock still stamps every write.

These tests use a real wall clock stepped back, so they wait a few real seconds.
"""

from __future__ import annotations

import threading
import time

import fencepost
from fencepost.clock import ManualClock, Steady, SystemClock
from fencepost.worker import Cancelled, RunContext, Worker
from tests.worker.conftest import wait_for

STEP_MS = 60_000


class SteppedClock(SystemClock):
    """The wall clock, minus ``back`` milliseconds: set ``back`` to step it backwards."""

    back = 0

    def now_ms(self) -> int:
        return super().now_ms() - self.back


def _checking(started: threading.Event, ended: list[float], until: type[BaseException]):
    """A run function that calls ``check()`` every 20 ms until it raises ``until``, noting when."""

    def fn(ctx: RunContext):
        started.set()
        try:
            while True:
                ctx.check()
                time.sleep(0.02)
        except until:
            ended.append(time.monotonic())
            raise

    return fn


def test_steady_follows_a_manual_clock_exactly() -> None:
    clock = ManualClock(5_000)
    steady = Steady(clock)
    assert steady.now_ms() == 5_000
    clock.advance(1_234)
    assert steady.now_ms() == 6_234
    assert steady.read() == (6_234, 6_234)


def test_steady_counts_a_backward_step_as_real_time() -> None:
    clock = SteppedClock()
    steady = Steady(clock)
    before = steady.now_ms()
    clock.back = STEP_MS
    time.sleep(0.05)
    wall, paced = steady.read()
    assert wall < before  # the stamp is the clock's own, stepped back
    assert before + 40 <= paced < before + 5_000  # the pace went on with real time
    time.sleep(0.05)
    assert steady.now_ms() >= paced + 40


def test_heartbeats_go_on_after_the_store_clock_steps_back(db_url: str) -> None:
    clock = SteppedClock()
    with fencepost.open(db_url, clock=clock) as store:
        store.runs.create("r1", "{}")
        stop = threading.Event()
        started = threading.Event()

        def fn(ctx: RunContext):
            started.set()
            while not stop.is_set():
                ctx.check()
                time.sleep(0.05)
            return {}

        worker = Worker(store, fn)
        t = threading.Thread(target=worker.run, args=(stop,), daemon=True)
        t.start()
        try:
            assert started.wait(10)
            clock.back = STEP_MS
            pulses = worker.supervisor.pulses
            beat = store.runs.get("r1").heartbeat_at_ms
            # Paced on the stepped clock, nothing was due for 60 s: not one pulse. (The stored heartbeat
            # never moves back, so it stands still until the clock catches up; the pulses renew it.)
            assert wait_for(lambda: worker.supervisor.pulses >= pulses + 2, 6), worker.supervisor.pulses
            assert store.runs.get("r1").heartbeat_at_ms == beat and not worker.supervisor.failed_pulses
        finally:
            stop.set()
            t.join(10)
        assert store.runs.get("r1").status == "completed"


def test_a_cancel_request_is_seen_after_the_store_clock_steps_back(db_url: str) -> None:
    clock = SteppedClock()
    with fencepost.open(db_url, clock=clock) as store:
        store.runs.create("r1", "{}")
        started = threading.Event()
        seen: list[float] = []
        worker = Worker(store, _checking(started, seen, Cancelled))
        t = threading.Thread(target=worker.run, kwargs={"until_idle": True}, daemon=True)
        t.start()
        assert started.wait(10)
        time.sleep(1.2)  # the worker has polled for cancel requests on the clock as it read before the step
        clock.back = STEP_MS
        asked = time.monotonic()
        store.runs.request_cancel("r1", clock.now_ms())
        t.join(8)
        assert seen and seen[0] - asked < 5, "the cancel request was not seen within 5 s"
        assert store.runs.get("r1").status == "cancelled"


def test_a_run_taken_over_after_the_store_clock_steps_back_is_noticed_at_the_next_pulse(db_url: str) -> None:
    """The owner is told (``LeaseLost`` at its next ``check()``) within a pulse or two, not after the step."""
    from fencepost import OwnerId
    from fencepost.worker import LeaseLost

    clock = SteppedClock()
    peer = OwnerId("host-b", 2, "n-b")
    with fencepost.open(db_url, clock=clock) as store:
        store.runs.create("r1", "{}")
        started = threading.Event()
        told: list[float] = []
        worker = Worker(store, _checking(started, told, LeaseLost))
        stop = threading.Event()
        t = threading.Thread(target=worker.run, args=(stop,), daemon=True)
        t.start()
        assert started.wait(10)
        clock.back = STEP_MS
        # The run leaves this owner (an operator parks it) and a peer takes it.
        store.runs.transition_owned("r1", worker.owner, "suspended")
        row = store.runs.get("r1")
        claimed = store.runs.claim("r1", row.snapshot(), peer, clock.now_ms())
        store.runs.activate("r1", peer, claimed.claimed_at_ms, row.snapshot())
        taken = time.monotonic()
        wait_for(lambda: bool(told), 8)
        stop.set()
        t.join(10)
        assert told and told[0] - taken < 5, "the owner was not told within 5 s"
        assert store.runs.get("r1").owner == peer
