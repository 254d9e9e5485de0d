"""RunStore, AttemptStore, ownership supervision, heartbeat constants, outcomes, metrics.

``__all__`` here is what ``fencepost`` re-exports from the run store: the stores, the row and
evidence types, and every outcome class (the per-operation union aliases stay in
``fencepost.runstore.outcomes``).
"""

from fencepost.runstore.attempts import AttemptStore as AttemptStore
from fencepost.runstore.outcomes import *  # noqa: F403 - the union aliases too; the classes, by name below
from fencepost.runstore.outcomes import Abandoned as Abandoned
from fencepost.runstore.outcomes import Activated as Activated
from fencepost.runstore.outcomes import AlreadyClaimed as AlreadyClaimed
from fencepost.runstore.outcomes import AlreadyRequested as AlreadyRequested
from fencepost.runstore.outcomes import CancelRequested as CancelRequested
from fencepost.runstore.outcomes import ClaimChanged as ClaimChanged
from fencepost.runstore.outcomes import Claimed as Claimed
from fencepost.runstore.outcomes import ClaimFresh as ClaimFresh
from fencepost.runstore.outcomes import ClaimLost as ClaimLost
from fencepost.runstore.outcomes import Conflict as Conflict
from fencepost.runstore.outcomes import EvidenceRequired as EvidenceRequired
from fencepost.runstore.outcomes import ExistingSame as ExistingSame
from fencepost.runstore.outcomes import FenceLost as FenceLost
from fencepost.runstore.outcomes import Finished as Finished
from fencepost.runstore.outcomes import GuardFailed as GuardFailed
from fencepost.runstore.outcomes import HeartbeatFresh as HeartbeatFresh
from fencepost.runstore.outcomes import Inserted as Inserted
from fencepost.runstore.outcomes import LivenessUnconfirmed as LivenessUnconfirmed
from fencepost.runstore.outcomes import NotFound as NotFound
from fencepost.runstore.outcomes import Outcome as Outcome
from fencepost.runstore.outcomes import Patched as Patched
from fencepost.runstore.outcomes import Recovered as Recovered
from fencepost.runstore.outcomes import RunNotFound as RunNotFound
from fencepost.runstore.outcomes import SnapshotChanged as SnapshotChanged
from fencepost.runstore.outcomes import StateChanged as StateChanged
from fencepost.runstore.outcomes import Terminal as Terminal
from fencepost.runstore.outcomes import Transitioned as Transitioned
from fencepost.runstore.outcomes import Updated as Updated
from fencepost.runstore.outcomes import Upserted as Upserted
from fencepost.runstore.rows import Attempt as Attempt
from fencepost.runstore.rows import AttemptPolicy as AttemptPolicy
from fencepost.runstore.rows import LivenessEvidence as LivenessEvidence
from fencepost.runstore.rows import RunFailure as RunFailure
from fencepost.runstore.rows import RunRow as RunRow
from fencepost.runstore.rows import RunSnapshot as RunSnapshot
from fencepost.runstore.store import RunStore as RunStore

# A literal list, so type checkers see every name ``fencepost`` re-exports (a test keeps it equal to
# the base names plus every class of RUN_OUTCOMES and ATTEMPT_OUTCOMES).
__all__ = [
    "Abandoned",
    "Activated",
    "AlreadyClaimed",
    "AlreadyRequested",
    "Attempt",
    "AttemptPolicy",
    "AttemptStore",
    "CancelRequested",
    "ClaimChanged",
    "ClaimFresh",
    "ClaimLost",
    "Claimed",
    "Conflict",
    "EvidenceRequired",
    "ExistingSame",
    "FenceLost",
    "Finished",
    "GuardFailed",
    "HeartbeatFresh",
    "Inserted",
    "LivenessEvidence",
    "LivenessUnconfirmed",
    "NotFound",
    "Outcome",
    "Patched",
    "Recovered",
    "RunFailure",
    "RunNotFound",
    "RunRow",
    "RunSnapshot",
    "RunStore",
    "SnapshotChanged",
    "StateChanged",
    "Terminal",
    "Transitioned",
    "Updated",
    "Upserted",
]
