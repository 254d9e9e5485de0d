"""Supervision lifecycle: a ``LeaseKeeper`` that is not keeping its lease says so, and a supervisor
stopped and started from one thread while a loop hook holds a run again never hangs (real store,
both backends, real threads, every wait bounded). Each test's docstring says what was wrong.
"""

from __future__ import annotations

import threading
import time

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.runstore.ownership import LeaseKeeper, LeaseLost, Supervisor
from tests.conftest import eventually
from tests.runstore.conftest import A, activate_new


def test_check_on_a_keeper_never_started_raises_instead_of_passing(store):
    """``check()`` before ``start()`` returned quietly: a caller who forgot to enter the keeper
    believed every unit of work ran under a kept lease, while nothing pulsed and no steal could ever
    be noticed."""
    activate_new(store, "r1", A)
    keeper = LeaseKeeper(store, "r1", A, clock=ManualClock(0))
    with pytest.raises(fencepost.RunStoreError) as info:
        keeper.check()
    err = info.value
    assert err.code == "invalid_run" and err.method == "LeaseKeeper.check"
    assert "start()" in str(err) and "r1" not in str(err)
    assert not keeper.lost
    assert keeper.supervisor.pulses == 0  # nothing was started by asking


def test_check_after_stop_raises_and_a_lease_lost_before_stop_stays_lost(store):
    """After ``stop()`` (the ``with`` block left) ``check()`` passed again, though nothing renews the
    lease any more; a lease that was lost keeps raising ``LeaseLost`` (the truth wins)."""
    activate_new(store, "r1", A)
    clock = ManualClock(0)
    keeper = LeaseKeeper(store, "r1", A, clock=clock)
    with keeper:
        clock.set(1000)
        # The renewal itself, then settle(): settle() alone stops waiting for a pulse in flight after a
        # short grace, and a pulse taken in only after the clock moved to 2000 below would put the
        # next one at 3000 (one interval after the reading it was taken in at).
        assert eventually(lambda: store.runs.get("r1").heartbeat_at_ms == 1000)
        keeper.settle()
        keeper.check()
    with pytest.raises(fencepost.RunStoreError) as info:
        keeper.check()
    assert info.value.code == "invalid_run"
    with keeper:  # entered again: keeping the lease again
        keeper.check()
        store.runs.transition_owned("r1", A, "completed")
        clock.set(2000)
        keeper.settle()
        # settle() stops waiting for a pulse in flight after a short grace: on a loaded machine the
        # pulse that finds the fence gone may still be on its way.
        assert eventually(lambda: keeper.lost)
        with pytest.raises(LeaseLost):
            keeper.check()
    with pytest.raises(LeaseLost):
        keeper.check()


def test_stop_then_start_from_another_thread_while_a_hook_holds_again_does_not_hang(store):
    """A loop hook (``on_lapse``) that held another run while another thread stopped and started the
    supervisor cleared the stop from inside the loop: the loop never ended, and the starting thread
    waited for it forever (``start()`` joins a stopping loop without a timeout)."""
    activate_new(store, "r1", A)
    activate_new(store, "r2", A)
    clock = store.clock  # the store's too: a pulse's now_ms may not run ahead of it
    sup = Supervisor(store, A)
    in_hook = threading.Event()
    stopping = threading.Event()
    hook_done = threading.Event()
    held: list[object] = []

    def on_lapse(unconfirmed_ms: int) -> None:
        in_hook.set()
        stopping.wait(5)  # the other thread has asked the loop to stop
        held.append(sup.hold("r2"))  # the hook keeps going: it holds another run
        hook_done.set()

    # Writes fail from now on: r1 lapses at the write tolerance and calls the hook on the loop.
    sup.hold("r1", on_lapse=on_lapse)
    original = store.runs

    class Failing:
        def __getattr__(self, name):
            if name in ("heartbeat", "heartbeat_many", "reconfirm"):
                def fail(*a, **k):
                    raise fencepost.RunStoreError("persistence_failed", name, "run persistence failed")
                return fail
            return getattr(original, name)

    store.runs = Failing()
    restarted = threading.Event()

    def stop_then_start() -> None:
        in_hook.wait(5)
        sup.stop(timeout=0)
        stopping.set()
        sup.start()  # waits for the stopping loop: it must end
        restarted.set()

    other = threading.Thread(target=stop_then_start, daemon=True)
    other.start()
    try:
        clock.set(19_000)
        assert in_hook.wait(5), "the lease never lapsed"
        assert hook_done.wait(5)
        assert restarted.wait(5), "start() from another thread hung behind a loop that never stopped"
        store.runs = original
        # Exactly one loop runs afterwards, and it renews the run the hook held. On a loaded
        # machine a heartbeat write may outlast settle()'s grace for a pulse in flight, so the clock
        # keeps moving (a second a step, inside the lease) until the renewal has landed.
        t = 19_000
        deadline = time.monotonic() + 15
        while store.runs.get("r2").heartbeat_at_ms < 21_000 and time.monotonic() < deadline:
            t += 1_000
            clock.set(t)
            sup.settle()
            time.sleep(0.02)
        assert [t.name for t in threading.enumerate()].count("fencepost-supervisor") == 1
        assert sup.held() == ["r2"]
        assert store.runs.get("r2").heartbeat_at_ms >= 21_000
    finally:
        store.runs = original
        stopping.set()
        sup.stop()
        other.join(5)
