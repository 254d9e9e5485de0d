"""Every outcome of the run and attempt stores: competition is a value, failure is an error.

Each class name is the seed's ``_tag``; msgspec tags every value with it, so outcomes encode as
``{"type": "Claimed", ...}`` and match in ``match`` statements by class. Each operation has one
union alias so a type checker notices a missing case.
"""

from __future__ import annotations

import re
from typing import TypeAlias

import msgspec


class Outcome(msgspec.Struct, frozen=True, tag=True):
    """Result of a race the store settled: the call worked; this says who won."""


# --------------------------------------------------------------------------- run store
class Claimed(Outcome, frozen=True):
    """The claim was granted; ``claimed_at_ms`` is the fence token for ``activate``."""

    claimed_at_ms: int


class Activated(Outcome, frozen=True):
    """The caller now owns the run (status ``running``, first heartbeat written)."""


class AlreadyClaimed(Outcome, frozen=True):
    """Another process holds the claim columns."""


class HeartbeatFresh(Outcome, frozen=True):
    """The row is ``running`` under a live lease."""


class SnapshotChanged(Outcome, frozen=True):
    """The row moved between the caller's read and its write."""


class EvidenceRequired(Outcome, frozen=True):
    """The snapshot is current and its stale owner needs liveness evidence to be replaced."""


class LivenessUnconfirmed(Outcome, frozen=True):
    """The evidence did not match the owner, its host scope or ``now_ms``: nothing was tried."""


class ClaimLost(Outcome, frozen=True):
    """The claim columns no longer match the caller's token."""


class ClaimFresh(Outcome, frozen=True):
    """The claim to recover is still inside the staleness window."""


class ClaimChanged(Outcome, frozen=True):
    """The claim to recover is no longer the one named."""


class Abandoned(Outcome, frozen=True):
    """The caller's claim was released."""


class Recovered(Outcome, frozen=True):
    """The stale claim was cleared."""


class FenceLost(Outcome, frozen=True):
    """Another owner holds the run (or nobody does): stop working on it."""


class GuardFailed(Outcome, frozen=True):
    """The caller owns the run; the transition guard refused the write."""


class Updated(Outcome, frozen=True):
    """The heartbeat was accepted; ``heartbeat_at_ms`` is the stamp now stored (never moves back)."""

    heartbeat_at_ms: int | None = None


class Transitioned(Outcome, frozen=True):
    """The owned transition was written."""


class NotFound(Outcome, frozen=True):
    """No such run (or attempt) row."""


class CancelRequested(Outcome, frozen=True):
    """This call recorded the cancellation request at ``requested_at_ms``."""

    requested_at_ms: int


class AlreadyRequested(Outcome, frozen=True):
    """A request was already recorded; ``requested_at_ms`` is the original time."""

    requested_at_ms: int


class Terminal(Outcome, frozen=True):
    """The run had already settled as ``status``; nothing was recorded."""

    status: str


# --------------------------------------------------------------------------- attempt store
class Inserted(Outcome, frozen=True):
    """The attempt row was inserted."""


class Upserted(Outcome, frozen=True):
    """An in-progress attempt was overwritten (``put_mode="upsert"``)."""


class ExistingSame(Outcome, frozen=True):
    """The attempt already exists with the same content."""


class Conflict(Outcome, frozen=True):
    """The attempt already exists with other content."""


class RunNotFound(Outcome, frozen=True):
    """The attempt's run does not exist."""


class StateChanged(Outcome, frozen=True):
    """The attempt is no longer in an in-progress state."""


class Finished(Outcome, frozen=True):
    """The attempt was settled."""


class Patched(Outcome, frozen=True):
    """The attempt's optional fields were patched."""


ClaimOutcome: TypeAlias = Claimed | NotFound | AlreadyClaimed | HeartbeatFresh | SnapshotChanged
ClaimAndOwnOutcome: TypeAlias = (
    Activated | NotFound | AlreadyClaimed | HeartbeatFresh | SnapshotChanged | EvidenceRequired
)
ActivateOutcome: TypeAlias = Activated | ClaimLost | SnapshotChanged
AbandonClaimOutcome: TypeAlias = Abandoned | ClaimLost
RecoverClaimOutcome: TypeAlias = Recovered | NotFound | ClaimFresh | ClaimChanged | LivenessUnconfirmed
StealOutcome: TypeAlias = (
    Claimed | NotFound | AlreadyClaimed | HeartbeatFresh | SnapshotChanged | LivenessUnconfirmed
)
HeartbeatOutcome: TypeAlias = Updated | FenceLost | NotFound
ReconfirmOutcome: TypeAlias = Updated | FenceLost | NotFound
TransitionOutcome: TypeAlias = Transitioned | FenceLost | NotFound | GuardFailed
RequestCancelOutcome: TypeAlias = CancelRequested | AlreadyRequested | Terminal | NotFound
PutOutcome: TypeAlias = Inserted | Upserted | ExistingSame | Conflict | FenceLost | RunNotFound
AttemptHeartbeatOutcome: TypeAlias = Updated | FenceLost | NotFound | StateChanged
FinishOutcome: TypeAlias = Finished | FenceLost | NotFound | StateChanged
PatchOutcome: TypeAlias = Patched | NotFound | FenceLost

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


_TAGS: dict[type, str] = {}


def snake_tag(outcome: Outcome | type[Outcome]) -> str:
    """The outcome's tag in snake case (``HeartbeatFresh`` -> ``heartbeat_fresh``), as metrics use it."""
    cls = outcome if isinstance(outcome, type) else type(outcome)
    tag = _TAGS.get(cls)
    if tag is None:
        tag = _TAGS[cls] = _CAMEL.sub("_", cls.__name__).lower()
    return tag


RUN_OUTCOMES = (
    Claimed, Activated, AlreadyClaimed, HeartbeatFresh, SnapshotChanged, EvidenceRequired,
    LivenessUnconfirmed, ClaimLost, ClaimFresh, ClaimChanged, Abandoned, Recovered, FenceLost,
    GuardFailed, Updated, Transitioned, NotFound, CancelRequested, AlreadyRequested, Terminal,
)
ATTEMPT_OUTCOMES = (Inserted, Upserted, ExistingSame, Conflict, RunNotFound, StateChanged, Finished, Patched)

__all__ = [
    "AbandonClaimOutcome",
    "Abandoned",
    "ActivateOutcome",
    "Activated",
    "AlreadyClaimed",
    "AlreadyRequested",
    "AttemptHeartbeatOutcome",
    "CancelRequested",
    "ClaimAndOwnOutcome",
    "ClaimChanged",
    "ClaimFresh",
    "ClaimLost",
    "ClaimOutcome",
    "Claimed",
    "Conflict",
    "EvidenceRequired",
    "ExistingSame",
    "FenceLost",
    "FinishOutcome",
    "Finished",
    "GuardFailed",
    "HeartbeatFresh",
    "HeartbeatOutcome",
    "Inserted",
    "LivenessUnconfirmed",
    "NotFound",
    "Outcome",
    "PatchOutcome",
    "Patched",
    "PutOutcome",
    "ReconfirmOutcome",
    "RecoverClaimOutcome",
    "Recovered",
    "RequestCancelOutcome",
    "RunNotFound",
    "SnapshotChanged",
    "StateChanged",
    "StealOutcome",
    "Terminal",
    "TransitionOutcome",
    "Transitioned",
    "Updated",
    "Upserted",
]
