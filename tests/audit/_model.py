"""The seeds' ownership rules as a plain-Python model of one run row (and its lease).

The model is written from the specification of each operation (the claim, steal, activate,
claim-and-own, abandon, recover, heartbeat, reconfirm, transition and cancel rules of the run
store), not from the store's code: each method returns the outcome the store must return and
updates the model row the way the store must update its row. It also keeps the ownership
intervals an auditor must see: one per activation, ended by ``released`` (the owner left or
re-owned), ``stolen`` (a thief activated) or still open.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fencepost import OwnerId, RunSnapshot
from fencepost.runstore.outcomes import (
    Abandoned,
    Activated,
    AlreadyClaimed,
    AlreadyRequested,
    CancelRequested,
    ClaimChanged,
    Claimed,
    ClaimFresh,
    ClaimLost,
    EvidenceRequired,
    FenceLost,
    GuardFailed,
    HeartbeatFresh,
    LivenessUnconfirmed,
    NotFound,
    Recovered,
    SnapshotChanged,
    Terminal,
    Transitioned,
    Updated,
)

STALE_AFTER_MS = 30_000
SKEW_ALLOWANCE_MS = 10_000
TERMINAL = ("completed", "failed", "cancelled")


class SkewRefused(Exception):
    """The model's verdict that a lease reading is too far ahead of the store clock (invalid_run)."""


def evidence_ok(kind: str, expected_owner: OwnerId, checked_at: int, displaced: OwnerId | None,
                actor: OwnerId, now: int) -> bool:
    """Seed liveness-evidence rule: names the displaced owner, binds to ``now``, kind's host rule."""
    if displaced is None or expected_owner != displaced or checked_at != now:
        return False
    if kind == "same-host-pid-dead":
        return actor.host_id == displaced.host_id
    if kind == "cross-host-unreachable-stale":
        return actor.host_id != displaced.host_id
    return kind == "lease-expired"


@dataclass
class ModelRun:
    run_id: str
    status: str = "pending"
    owner: OwnerId | None = None
    heartbeat: int | None = None
    claim: tuple[OwnerId, int] | None = None
    claim_kind: str | None = None
    cancel: int | None = None
    #: The owner released its own steal-claim, and with it the whole lease (see ``_release``).
    lease_gone: bool = False
    snapshots: list[RunSnapshot] = field(default_factory=list)
    tokens: list[tuple[OwnerId, int]] = field(default_factory=list)
    #: [owner, ended_by]: ended_by None while open.
    intervals: list[list] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.remember()

    # ------------------------------------------------------------------ helpers
    def snapshot(self) -> RunSnapshot:
        return RunSnapshot(self.status, self.owner, self.heartbeat)

    def remember(self) -> None:
        s = self.snapshot()
        if s not in self.snapshots:
            self.snapshots.append(s)

    def matches(self, s: RunSnapshot) -> bool:
        return (self.status, self.owner, self.heartbeat) == (s.status, s.owner, s.heartbeat_at_ms)

    def classify(self, now: int):
        if self.claim is not None:
            return AlreadyClaimed()
        if self.status == "running" and self.heartbeat is not None and self.heartbeat >= now - STALE_AFTER_MS:
            return HeartbeatFresh()
        return SnapshotChanged()

    def _open(self, owner: OwnerId) -> None:
        self.intervals.append([owner, None])

    def _close(self, ended_by: str) -> None:
        if self.intervals and self.intervals[-1][1] is None:
            self.intervals[-1][1] = ended_by

    def _release(self, who: OwnerId) -> None:
        # The strategy's release drops whatever ``who`` holds, ownership included: an owner that
        # stole its own run and then lets that claim go leaves the row running under it with no
        # lease behind it (the store's documented behaviour, as upstream's). Only that owner's
        # claim_and_own takes the run back.
        if who == self.owner:
            self.lease_gone = True

    @staticmethod
    def lease_now(now: int, clock: int) -> int:
        if now > clock + SKEW_ALLOWANCE_MS:
            raise SkewRefused
        return now

    # ------------------------------------------------------------------ operations
    def claim_op(self, expected: RunSnapshot, claimant: OwnerId, now: int, clock: int):
        self.lease_now(now, clock)
        if not (self.status in ("pending", "suspended") and self.matches(expected) and self.claim is None):
            return self.classify(now)
        self.claim, self.claim_kind = (claimant, now), "claimed"
        self.tokens.append(self.claim)
        return Claimed(now)

    def steal_op(self, expected: RunSnapshot, claimant: OwnerId, now: int, clock: int, ev: tuple):
        self.lease_now(now, clock)
        if expected.status != "running" or not evidence_ok(*ev, expected.owner, claimant, now):
            return LivenessUnconfirmed()
        assert expected.heartbeat_at_ms is not None
        if not (self.matches(expected) and self.claim is None and expected.heartbeat_at_ms < now - STALE_AFTER_MS):
            return self.classify(now)
        if self.lease_gone:
            return self.classify(now)
        self.claim, self.claim_kind = (claimant, now), "stolen"
        self.tokens.append(self.claim)
        return Claimed(now)

    def activate_op(self, claimant: OwnerId, token: int, expected: RunSnapshot, clock: int):
        if self.claim != (claimant, token):
            return ClaimLost()
        if not self.matches(expected):
            self._release(claimant)
            self.claim = self.claim_kind = None
            return SnapshotChanged()
        if self.status == "running":
            self._close("stolen")
        self.status, self.owner, self.heartbeat = "running", claimant, clock
        self.claim = self.claim_kind = None
        self._open(claimant)
        return Activated()

    def claim_and_own_op(self, expected: RunSnapshot, owner: OwnerId, now: int, clock: int, ev: tuple | None):
        self.lease_now(now, clock)
        if expected.status == "running" and expected.owner != owner and not (
                ev is not None and evidence_ok(*ev, expected.owner, owner, now)):
            loss = self.classify(now)
            if isinstance(loss, SnapshotChanged) and self.matches(expected) and self.claim is None:
                return EvidenceRequired()
            return loss
        if self.status not in ("pending", "suspended", "running") or not (
                self.matches(expected) and self.claim is None) or (
                expected.status == "running" and self.heartbeat >= now - STALE_AFTER_MS):
            return self.classify(now)
        if self.lease_gone and expected.owner != owner:
            return self.classify(now)
        self.lease_gone = False
        if self.status == "running":
            self._close("released" if expected.owner == owner else "stolen")
        self.status, self.owner, self.heartbeat = "running", owner, now
        self.tokens.append((owner, now))
        self._open(owner)
        return Activated()

    def abandon_op(self, claimant: OwnerId, token: int):
        if self.claim != (claimant, token):
            return ClaimLost()
        self._release(claimant)
        self.claim = self.claim_kind = None
        return Abandoned()

    def recover_op(self, stale: OwnerId, token: int, observer: OwnerId, now: int, clock: int, ev: tuple):
        self.lease_now(now, clock)
        if not evidence_ok(*ev, stale, observer, now):
            return LivenessUnconfirmed()
        if self.claim != (stale, token):
            return ClaimChanged()
        if token >= now - STALE_AFTER_MS:
            return ClaimFresh()
        self.claim = self.claim_kind = None
        return Recovered()

    def heartbeat_op(self, owner: OwnerId, now: int, clock: int, *, reconfirm: bool):
        self.lease_now(now, clock)
        if self.status != "running" or self.owner != owner or self.lease_gone or (
                reconfirm and self.claim is not None):
            return FenceLost()
        assert self.heartbeat is not None
        self.heartbeat = max(self.heartbeat, now)
        return Updated(self.heartbeat)

    def transition_op(self, owner: OwnerId, to: str, guard: str | None, clock: int):
        if self.status != "running" or self.owner != owner or self.lease_gone:
            return FenceLost()
        if (guard == "absent" and self.cancel is not None) or (guard == "present" and self.cancel is None):
            return GuardFailed()
        if to == "running":
            return Transitioned()
        self.status, self.owner, self.heartbeat = to, None, None
        self.claim = self.claim_kind = None
        self._close("released")
        return Transitioned()

    def cancel_op(self, now: int):
        if self.status in TERMINAL:
            return Terminal(self.status)
        if self.cancel is not None:
            return AlreadyRequested(self.cancel)
        self.cancel = now
        return CancelRequested(now)


__all__ = ["ModelRun", "NotFound", "SkewRefused", "evidence_ok"]
