"""Liveness checks (UPSTREAM-TESTS A7 OW-01..15)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from unittest import mock

import pytest

from fencepost import Claimed, HeartbeatFresh, LivenessEvidence, LivenessUnconfirmed
from fencepost.journal.owner import OwnerId
from fencepost.runstore.liveness import LivenessContext, lease_liveness, same_host_pid_probe

from .conftest import A, activate_new, fresh, running

SAME = OwnerId("host-a", 202, "same")
OTHER = OwnerId("host-b", 303, "other")


def ctx(claimant, hb, now):
    return LivenessContext(claimant, hb, now)


@pytest.mark.parametrize("stale_after,hb,now,alive", [
    (timedelta(seconds=30), 0, 30_000, True), (timedelta(seconds=30), 0, 30_001, False),
    (timedelta(seconds=30), None, 0, False),
    (timedelta(seconds=1), 4_000, 5_000, True), (timedelta(seconds=1), 3_999, 5_000, False),
], ids=["30s-at-cutoff", "30s-past", "no-heartbeat", "1s-fresh", "1s-stale"])
def test_lease_liveness(stale_after, hb, now, alive):
    """OW-01, OW-02, OW-03."""
    assert lease_liveness(stale_after)(A, ctx(SAME, hb, now)) is alive


def test_lease_expired_evidence_admits_a_cross_host_steal_only_when_stale(mstore):
    """OW-05, OW-06, OW-07: the write predicate refuses a fresh lease, not the evidence."""
    clock = mstore.clock
    r1, r2, r3 = fresh(), fresh(), fresh()
    base = clock.now_ms()
    for r in (r1, r2, r3):
        activate_new(mstore, r, A)
    clock.set(base + 29_999)
    n = base + 29_999
    assert mstore.runs.steal(r1, running(A, base), SAME, n, LivenessEvidence(A, n, "lease-expired")) == HeartbeatFresh()
    clock.set(base + 30_001)
    n = base + 30_001
    assert mstore.runs.steal(r2, running(A, base), OTHER, n, LivenessEvidence(A, n, "lease-expired")) == Claimed(n)
    assert mstore.runs.steal(r3, running(A, base), OTHER, n,
                             LivenessEvidence(OTHER, n, "lease-expired")) == LivenessUnconfirmed()


@pytest.mark.parametrize("effect,alive", [
    (None, True), (ProcessLookupError(), False), (PermissionError(), True), (OSError(13, "EACCES"), True),
    (OSError(22, "EINVAL"), True), (RuntimeError("odd"), True),
], ids=["returns", "esrch", "eperm", "eacces", "einval", "other"])
def test_pid_probe_reads_only_esrch_as_death(effect, alive):
    """OW-08: kill(pid, 0) is called exactly once."""
    with mock.patch("os.kill", side_effect=effect) as kill:
        assert same_host_pid_probe(A, ctx(SAME, 0, 0)) is alive
    kill.assert_called_once_with(A.pid, 0)


def test_pid_probe_answers_false_for_another_host_without_probing():
    """OW-09, OW-14."""
    with mock.patch("os.kill") as kill:
        assert same_host_pid_probe(A, ctx(OTHER, 0, 0)) is False
        me = OwnerId("host-x", os.getpid(), "n")
        assert same_host_pid_probe(me, ctx(OTHER, 0, 0)) is False
    kill.assert_not_called()


@pytest.mark.parametrize("pid", [0, -1, 1.5, float("nan")], ids=["0", "-1", "1.5", "nan"])
def test_pid_probe_never_signals_non_positive_or_odd_pids(pid):
    """OW-10."""
    with mock.patch("os.kill") as kill:
        assert same_host_pid_probe(OwnerId("host-a", pid, "n"), ctx(SAME, 0, 0)) is True
    kill.assert_not_called()


def test_pid_probe_against_real_processes():
    """OW-11, OW-12, OW-13, OW-15: own pid alive (any nonce); a reaped child dead; pid 1 (EPERM or alive) alive."""
    me = os.getpid()
    assert same_host_pid_probe(OwnerId("host-a", me, "n1"), ctx(SAME, 0, 0)) is True
    assert same_host_pid_probe(OwnerId("host-a", me, "n2"), ctx(OwnerId("host-a", me, "n1"), 0, 0)) is True
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert same_host_pid_probe(OwnerId("host-a", child.pid, "n"), ctx(SAME, 0, 0)) is False
    assert same_host_pid_probe(OwnerId("host-a", 1, "init"), ctx(SAME, 0, 0)) is True


def test_evidence_kinds_follow_the_host_relation():
    """OW-04 (pure rule, no database): ``sameHostIncarnation`` is our evidence kinds' host rule:
    ``same-host-pid-dead`` holds for a claimant on the owner's host only, ``cross-host-unreachable-stale``
    for another host only, ``lease-expired`` for either."""
    from fencepost.journal.consensus import evidence_matches

    def holds(kind, claimant):
        return evidence_matches(LivenessEvidence(A, 7, kind), A, claimant, 7)

    assert holds("same-host-pid-dead", SAME) is True
    assert holds("same-host-pid-dead", OTHER) is False
    assert holds("cross-host-unreachable-stale", SAME) is False
    assert holds("cross-host-unreachable-stale", OTHER) is True
    assert holds("lease-expired", SAME) is True and holds("lease-expired", OTHER) is True
