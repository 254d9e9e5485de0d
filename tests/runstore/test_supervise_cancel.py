"""``supervise()`` under the caller's cancellation (real store, both backends, real asyncio tasks).

Each test's docstring says what was wrong. The caller cancels the way a service does: ``Task.cancel()``
from another task (a shutdown) or an ``asyncio.timeout`` around the block.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import fencepost
from fencepost.runstore.ownership import LeaseLost, Supervisor, supervise
from fencepost.runstore.rows import LivenessEvidence
from tests.conftest import eventually
from tests.runstore.conftest import A, B, activate_new


def _supervisor_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "fencepost-supervisor"}


def _steal_after_expiry(store: fencepost.Store, run_id: str) -> str:
    """B takes ``run_id`` once A's lease is past ``STALE_AFTER``: what it answers."""
    store.clock.set(store.clock.now_ms() + 35_001)
    now = store.clock.now_ms()
    row = store.runs.get(run_id)
    return type(store.runs.steal(run_id, row, B, now, LivenessEvidence(A, now, "lease-expired"))).__name__


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_a_cancellation_while_the_block_exits_still_stops_its_supervisor(store, monkeypatch, how):
    """The block's exit stopped its own supervisor with ``await asyncio.to_thread(sup.stop)``. A
    cancellation (``Task.cancel``, a timeout) that landed while that call was still queued in a busy
    default executor cancelled the queued call too: ``stop()`` never ran, and the
    ``fencepost-supervisor`` thread lived for the rest of the process, waking every 5 ms.

    Made to happen every time: the default executor has one thread, kept busy by other work as the
    body ends, and the supervisor's loop thread takes a moment to end once told to stop (as it does
    while a hook or a store call finishes), so the cancellation always lands during the exit."""
    activate_new(store, "r1", A)
    before = _supervisor_threads()
    let_end = threading.Event()
    real_loop = Supervisor._loop

    def slow_to_end(self: Supervisor) -> None:
        real_loop(self)
        let_end.wait(10)

    monkeypatch.setattr(Supervisor, "_loop", slow_to_end)
    busy = threading.Event()
    leases: list = []
    scopes: list[asyncio.Timeout] = []
    body_done = threading.Event()

    async def owned() -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as scope:
            scopes.append(scope)
            async with supervise(store, "r1", A) as lease:
                leases.append(lease)
                loop.run_in_executor(None, busy.wait, 10)  # other to_thread work fills the executor
                body_done.set()  # no await from here to the exit's first one

    async def main() -> BaseException | None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        task = asyncio.create_task(owned())
        deadline = time.monotonic() + 5
        while not body_done.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        # The task waits in the block's exit, and this coroutine runs meanwhile: the exit does not
        # block the event loop while the supervisor thread takes its time to end.
        assert body_done.is_set() and not task.done()
        if how == "cancel":
            task.cancel()
        else:
            scopes[0].reschedule(loop.time())
        await asyncio.sleep(0.05)
        busy.set()
        try:
            await task
        except BaseException as exc:  # asserted below
            return exc
        finally:
            let_end.set()
        return None

    try:
        outcome = asyncio.run(asyncio.wait_for(main(), 20))
        expected = asyncio.CancelledError if how == "cancel" else TimeoutError
        assert isinstance(outcome, expected), outcome
        assert leases and leases[0].released and leases[0].supervisor.held() == []
        assert eventually(lambda: _supervisor_threads() <= before, 5), "the supervisor thread outlived its block"
        assert _steal_after_expiry(store, "r1") == "Claimed"  # nothing renewed the lease after the block
    finally:
        busy.set()
        let_end.set()
        for lease in leases:
            lease.supervisor.stop()


def test_blocks_cancelled_while_exiting_behind_a_busy_executor_leave_no_supervisor_thread(store):
    """The same defect without any patching: the owned work ends while other ``to_thread`` work fills
    the default executor, and the caller cancels the task a moment later, as a shutdown does. Each
    block's supervisor thread was left running for good."""
    activate_new(store, "r1", A)
    before = _supervisor_threads()
    leases: list = []
    outcomes: list[str] = []

    async def owned() -> None:
        async with supervise(store, "r1", A) as lease:
            leases.append(lease)
            await asyncio.sleep(0.05)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(2))
        for _ in range(5):
            task = asyncio.create_task(owned())
            await asyncio.sleep(0.02)  # inside the block
            busy = [loop.run_in_executor(None, time.sleep, 0.2) for _ in range(2)]
            await asyncio.sleep(0.1)  # the body has ended: the block is exiting
            landed = task.cancel()
            try:
                await task
                outcomes.append("ended" if not landed else "cancellation lost")
            except asyncio.CancelledError:
                outcomes.append("cancelled")
            await asyncio.gather(*busy)

    try:
        asyncio.run(asyncio.wait_for(main(), 20))
        assert "cancellation lost" not in outcomes
        assert all(lease.released for lease in leases) and len(leases) == 5
        assert eventually(lambda: _supervisor_threads() <= before, 5), "a supervisor thread outlived its block"
    finally:
        for lease in leases:
            lease.supervisor.stop()


@pytest.mark.parametrize("first", ["loss", "caller"])
def test_a_caller_cancellation_that_meets_a_lost_lease_still_cancels_the_task(store, clock, first):
    """When the fence was lost and the caller cancelled the task at about the moment the loss was
    noticed, the block undid only its own cancellation request but raised ``LeaseLost`` in place of
    the ``CancelledError``: the caller's cancellation was swallowed, and a worker that handles
    ``LeaseLost`` by moving on to its next run kept running after ``Task.cancel()``.

    The body blocks (no await) until both requests are queued on the loop, in either order: the
    block's own (the loss) and the caller's (a shutdown task)."""
    activate_new(store, "r1", A)
    before = _supervisor_threads()
    seen: dict[str, object] = {}

    async def worker(caller_may_cancel: asyncio.Event) -> None:
        try:
            async with supervise(store, "r1", A) as lease:
                seen["lease"] = lease
                # settled elsewhere (another part of the service): the next pulse finds the fence gone
                assert type(store.runs.transition_owned("r1", A, "completed")).__name__ == "Transitioned"
                if first == "caller":
                    caller_may_cancel.set()
                clock.advance(1000)
                assert eventually(lambda: lease.lost, 5)  # blocking: nothing runs on the loop meanwhile
                time.sleep(0.05)  # the block's own cancellation request is queued on the loop by now
                if first == "loss":
                    caller_may_cancel.set()
                await asyncio.sleep(5)
            seen["ended"] = True
        except LeaseLost:
            seen["moved on"] = True
            await asyncio.sleep(0.05)  # the next unit of work: a cancelled task must not get here
            seen["ran on"] = True
        except asyncio.CancelledError as exc:
            seen["context"] = exc.__context__
            raise

    async def main() -> asyncio.Task:
        caller_may_cancel = asyncio.Event()
        task = asyncio.create_task(worker(caller_may_cancel))
        await caller_may_cancel.wait()
        task.cancel()  # the service shuts down
        with pytest.raises(asyncio.CancelledError):
            await task
        return task

    task = asyncio.run(asyncio.wait_for(main(), 20))
    assert task.cancelled()
    assert "moved on" not in seen and "ran on" not in seen and "ended" not in seen
    context = seen["context"]
    assert isinstance(context, LeaseLost) and context.reason == "FenceLost" and context.run_id == "r1"
    lease = seen["lease"]
    assert lease.released and lease.supervisor.held() == []  # type: ignore[attr-defined]
    assert eventually(lambda: _supervisor_threads() <= before, 5)
    row = store.runs.get("r1")
    assert row.status == "completed" and row.owner is None


def test_a_loss_alone_still_ends_the_block_with_lease_lost_and_no_cancellation_left(store, clock):
    """Regression guard beside the fix above: with no cancellation from the caller, a lost fence
    still ends the block with ``LeaseLost`` (not ``CancelledError``), and nothing is left cancelling
    the task afterwards."""
    activate_new(store, "r1", A)

    async def main() -> tuple[str, int, str]:
        try:
            async with supervise(store, "r1", A):
                store.runs.transition_owned("r1", A, "completed")
                clock.advance(1000)
                await asyncio.sleep(5)
            outcome = "ended normally"
        except LeaseLost as exc:
            outcome = exc.reason
        await asyncio.sleep(0.05)
        return outcome, asyncio.current_task().cancelling(), "ran on"

    assert asyncio.run(asyncio.wait_for(main(), 10)) == ("FenceLost", 0, "ran on")
