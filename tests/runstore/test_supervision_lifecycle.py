"""Supervision lifecycle: a ``LeaseKeeper`` that is not keeping its lease says so, and a supervisor
stopped and started from one thread while a loop hook holds a run again never hangs (real store,
both backends, real threads, every wait bounded). Each test's docstring says what was wrong.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.runstore.ownership import LeaseKeeper, LeaseLost
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
        with pytest.raises(LeaseLost):
            keeper.check()
    with pytest.raises(LeaseLost):
        keeper.check()
