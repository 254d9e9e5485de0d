"""``supervise()`` as an asyncio service uses it, on a real store (both backends), on a ManualClock.

Each test's docstring says what was wrong. A lease is lost the way it is in production: the owner
stops pulsing, the clock passes ``STALE_AFTER``, and a peer steals the run with expired-lease evidence.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.runstore.ownership import LeaseKeeper, LeaseLost, Supervisor, supervise
from fencepost.runstore.rows import LivenessEvidence
from tests.runstore.conftest import A, B, activate_new


def _steal(store: fencepost.Store, run_id: str) -> None:
    """The store's clock passes STALE_AFTER and B steals ``run_id`` from A and activates it.

    The owner's supervisor runs on a clock of its own, still at 0: it stalled, and its next move is
    the test's to make, so no pulse or reconfirm can race the steal.
    """
    store.clock.set(store.clock.now_ms() + 35_001)
    now = store.clock.now_ms()
    row = store.runs.get(run_id)
    claimed = store.runs.steal(run_id, row, B, now, LivenessEvidence(A, now, "lease-expired"))
    assert type(claimed).__name__ == "Claimed"
    assert type(store.runs.activate(run_id, B, claimed.claimed_at_ms, row)).__name__ == "Activated"


def _supervisor_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(("fencepost-supervisor", "fencepost-lease"))}


def test_an_async_on_lapse_is_awaited_before_lease_lost_is_raised(store):
    """An ``async def`` ``on_lapse`` was called on the supervisor thread like a plain function: the
    coroutine it returned was never awaited (a RuntimeWarning), so the hook silently never ran."""
    activate_new(store, "r1", A)
    ran: list[tuple[int, bool]] = []

    async def on_lapse(unconfirmed_ms: int) -> None:
        await asyncio.sleep(0)
        ran.append((unconfirmed_ms, threading.current_thread() is threading.main_thread()))

    owner_clock = ManualClock(0)
    sup = Supervisor(store, A, clock=owner_clock)

    async def main() -> LeaseLost:
        with pytest.raises(LeaseLost) as info:
            async with supervise(store, "r1", A, on_lapse=on_lapse, supervisor=sup):
                await asyncio.sleep(0.05)
                _steal(store, "r1")
                owner_clock.set(19_000)  # no pulse went through: the tolerance is spent, reconfirm fails
                while True:
                    await asyncio.sleep(0.005)
        return info.value

    try:
        error = asyncio.run(asyncio.wait_for(main(), 10))
    finally:
        sup.stop()
    assert error.reason == "lapsed" and error.unconfirmed_ms == 19_000
    assert ran == [(19_000, True)]  # awaited once, on the loop, before the block raised


def test_an_async_on_reconfirm_runs_on_the_loop_and_supervision_carries_on(store, clock):
    """An ``async def`` ``on_reconfirm`` was never awaited either: the receipt 'succeeded' without
    running the hook."""
    activate_new(store, "r1", A)
    seen: list[int] = []

    async def on_reconfirm(unconfirmed_ms: int) -> None:
        await asyncio.sleep(0)
        seen.append(unconfirmed_ms)

    real = store.runs.heartbeat

    def failing(*a, **k):
        raise fencepost.RunStoreError("persistence_failed", "heartbeat", "run persistence failed")

    async def main() -> None:
        sup = Supervisor(store, A)
        async with supervise(store, "r1", A, on_reconfirm=on_reconfirm, supervisor=sup) as lease:
            store.runs.heartbeat = failing
            try:
                while clock.now_ms() < 19_000:
                    clock.advance(1000)
                    await asyncio.to_thread(sup.settle)
                deadline = time.monotonic() + 5
                while not seen and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            finally:
                store.runs.heartbeat = real
            lease.check()
        sup.stop()

    asyncio.run(asyncio.wait_for(main(), 20))
    assert seen == [19_000]
    assert store.runs.get("r1").heartbeat_at_ms == 19_000


def test_a_lease_lost_while_the_body_blocked_raises_lease_lost_at_the_end_of_the_block(store):
    """A lease lost while the body ran without awaiting (a blocking call) left no await point for
    the cancellation: the block ended normally, as if the work had been done under the lease."""
    activate_new(store, "r1", A)

    owner_clock = ManualClock(0)
    sup = Supervisor(store, A, clock=owner_clock)

    async def main() -> tuple[str, int]:
        try:
            async with supervise(store, "r1", A, supervisor=sup) as lease:
                await asyncio.sleep(0.05)
                _steal(store, "r1")
                owner_clock.set(1000)  # the next pulse finds the run taken
                deadline = time.monotonic() + 5
                while not lease.lost and time.monotonic() < deadline:
                    time.sleep(0.01)  # blocking on purpose: no await until the block ends
            outcome = "ended normally"
        except LeaseLost as exc:
            outcome = exc.reason
        await asyncio.sleep(0.05)  # no stray cancellation is left behind for later awaits
        return outcome, asyncio.current_task().cancelling()

    try:
        assert asyncio.run(asyncio.wait_for(main(), 10)) == ("FenceLost", 0)
    finally:
        sup.stop()


BAD = [
    ("run_id", {"run_id": 123}),
    ("run_id", {"run_id": ""}),
    ("owner", {"owner": "owner-a"}),
    ("on_lapse", {"on_lapse": "print"}),
    ("on_reconfirm", {"on_reconfirm": 5}),
]


@pytest.mark.parametrize(("field", "bad"), BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD)])
def test_supervise_refuses_bad_arguments_on_entry_and_starts_nothing(store, field, bad):
    """``supervise`` accepted any run id, owner and callbacks: a run id that is not a string made
    every pulse fail until the lease lapsed 19 s later, a non-callable hook failed only when the lease
    was lost, and the heartbeat thread ran meanwhile."""
    activate_new(store, "r1", A)
    before = store.runs.get("r1")
    threads = _supervisor_threads()
    args = {"run_id": "r1", "owner": A, **bad}

    async def main() -> None:
        async with supervise(store, args.pop("run_id"), args.pop("owner"), **args):
            raise AssertionError("the body ran")

    with pytest.raises(fencepost.RunStoreError) as info:
        asyncio.run(main())
    assert info.value.code == "invalid_run" and field in str(info.value)
    assert "owner-a" not in str(info.value) and "print" not in str(info.value)
    assert _supervisor_threads() <= threads
    assert store.runs.get("r1") == before


def test_supervise_refuses_an_owner_that_is_not_the_shared_supervisors(store):
    """With ``supervisor=`` given, ``owner`` was ignored: the run was pulsed as the supervisor's owner."""
    activate_new(store, "r1", A)
    threads = _supervisor_threads()
    sup = Supervisor(store, B)

    async def main() -> None:
        async with supervise(store, "r1", A, supervisor=sup):
            raise AssertionError("the body ran")

    with pytest.raises(fencepost.RunStoreError) as info:
        asyncio.run(main())
    assert info.value.code == "invalid_run" and "owner" in str(info.value)
    assert sup.held() == [] and _supervisor_threads() <= threads


async def _hook(ms: int) -> None:
    pass


@pytest.mark.parametrize("where", ["LeaseKeeper", "Supervisor.hold"])
@pytest.mark.parametrize("hook", ["on_lapse", "on_reconfirm"])
def test_threaded_supervision_refuses_coroutine_and_non_callable_hooks(store, where, hook):
    """``LeaseKeeper`` and ``Supervisor.hold`` took an ``async def`` hook (never awaited: it could not
    run, there is no loop) and any non-callable, failing only when the lease was lost."""
    activate_new(store, "r1", A)
    threads = _supervisor_threads()
    for bad in (_hook, "print"):
        with pytest.raises(fencepost.RunStoreError) as info:
            if where == "LeaseKeeper":
                LeaseKeeper(store, "r1", A, **{hook: bad})
            else:
                Supervisor(store, A).hold("r1", **{hook: bad})
        assert info.value.code == "invalid_run" and hook in str(info.value)
    assert _supervisor_threads() <= threads


@pytest.mark.parametrize("kind", ["plain", "async"])
def test_an_on_lapse_that_raises_is_logged_and_lease_lost_is_still_raised(store, kind, caplog):
    """Regression guard beside the async-hook fix: a failing hook, plain or async, never hides the
    loss (the block still raises ``LeaseLost``) and is reported in the log."""
    activate_new(store, "r1", A)
    owner_clock = ManualClock(0)
    sup = Supervisor(store, A, clock=owner_clock)

    def plain(ms: int) -> None:
        raise RuntimeError("hook failed")

    async def coroutine(ms: int) -> None:
        raise RuntimeError("hook failed")

    async def main() -> str:
        try:
            async with supervise(store, "r1", A, on_lapse=plain if kind == "plain" else coroutine, supervisor=sup):
                _steal(store, "r1")
                owner_clock.set(19_000)
                while True:
                    await asyncio.sleep(0.005)
        except LeaseLost as exc:
            return exc.reason
        return "no LeaseLost"

    try:
        with caplog.at_level("ERROR", logger="fencepost.ownership"):
            assert asyncio.run(asyncio.wait_for(main(), 10)) == "lapsed"
    finally:
        sup.stop()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("run r1: supervision callback failed\n"), errors
    assert "RuntimeError: hook failed" in errors[0]  # its traceback, redacted (test_callback_log_redaction.py)
