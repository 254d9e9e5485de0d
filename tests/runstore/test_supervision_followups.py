"""Supervision follow-ups (real store, both backends, every wait bounded). Each test's docstring
says what was wrong.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.runstore.ownership import LeaseLost, Supervisor
from tests.runstore.conftest import A, activate_new


def test_lease_check_after_release_raises_like_the_keeper(store):
    """``Lease.check()`` after ``release()`` passed quietly, while ``LeaseKeeper.check()`` after
    ``stop()`` raises ``invalid_run``: code holding a released lease believed its work still ran
    under a kept lease, though nothing renewed it and no steal could be noticed."""
    activate_new(store, "r1", A)
    sup = Supervisor(store, A, clock=ManualClock(0))
    try:
        lease = sup.hold("r1")
        lease.check()
        lease.release()
        with pytest.raises(fencepost.RunStoreError) as info:
            lease.check()
        err = info.value
        assert err.code == "invalid_run" and err.method == "Lease.check"
        assert "release" in str(err) and "r1" not in str(err)
        # Held again: the new lease checks; the released one still refuses.
        again = sup.hold("r1")
        again.check()
        with pytest.raises(fencepost.RunStoreError):
            lease.check()
    finally:
        sup.stop()


def test_a_lease_lost_before_release_keeps_raising_lease_lost(store):
    """The truth wins, as for the keeper: a lease lost while held raises ``LeaseLost`` after release."""
    activate_new(store, "r1", A)
    clock = ManualClock(0)
    sup = Supervisor(store, A, clock=clock)
    try:
        lease = sup.hold("r1")
        store.runs.transition_owned("r1", A, "completed")
        clock.set(1000)
        sup.settle()
        assert lease.lost
        lease.release()
        with pytest.raises(LeaseLost):
            lease.check()
    finally:
        sup.stop()
