"""Liveness checks with the seeds' shape: ``check(owner, context) -> bool``, True means alive.

A check answers the question the arbitration asks before it steals: is the recorded owner still
working? Answering True refuses the takeover. Every unknown answer is life (seed
``liveness-evidence.md``): a check that says "gone" about an owner it never looked at would let a
peer steal runs out of live processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta

from fencepost._values import SAFE_MAX
from fencepost.journal.owner import OwnerId
from fencepost.runstore.heartbeat import STALE_AFTER
from fencepost.runstore.rows import LivenessContext

LivenessCheck = Callable[[OwnerId, LivenessContext], bool]


def lease_liveness(stale_after: timedelta = STALE_AFTER) -> LivenessCheck:
    """Return a check that calls an owner alive while its heartbeat is not stale.

    Stale is strict (``heartbeat < now - stale_after``); an owner with no heartbeat is gone. This is
    the honest floor every host can give: a hard-killed owner's runs become reclaimable once the
    lease it stopped renewing expires.
    """
    cutoff_ms = stale_after // timedelta(milliseconds=1)

    def check(owner: OwnerId, context: LivenessContext) -> bool:
        hb = context.heartbeat_at_ms
        return hb is not None and hb >= context.now_ms - cutoff_ms

    return check


def same_host_pid_probe(owner: OwnerId, context: LivenessContext) -> bool:
    """Ask the operating system whether ``owner``'s process exists (``os.kill(pid, 0)``).

    An owner on another host than the claimant is answered False without probing (a pid names a
    process only on its own host; the expired lease decides). A pid that is not a positive safe
    integer is alive without signalling (0 and below address process groups). Only
    ``ProcessLookupError`` (ESRCH) is death; any other error, ``PermissionError`` included, is life.
    Consequence: an owner recorded with the claimant's own pid always reads as alive.
    """
    if owner.host_id != context.claimant.host_id:
        return False
    pid = owner.pid
    if type(pid) is not int or pid <= 0 or pid > SAFE_MAX:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except Exception:  # EPERM, EINVAL, anything unknown: an unknown answer is not death
        return True
    return True


__all__ = ["LivenessCheck", "LivenessContext", "lease_liveness", "same_host_pid_probe"]
