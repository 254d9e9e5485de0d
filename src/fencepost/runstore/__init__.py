"""RunStore, AttemptStore, ownership supervision, heartbeat constants, outcomes, metrics.

``__all__`` here is what ``fencepost`` re-exports from the run store: the stores, the row and
evidence types, and every outcome class (the per-operation union aliases stay in
``fencepost.runstore.outcomes``).
"""

from fencepost.runstore.attempts import AttemptStore as AttemptStore
from fencepost.runstore.outcomes import *  # noqa: F403 - every outcome class, listed in __all__ below
from fencepost.runstore.outcomes import ATTEMPT_OUTCOMES, RUN_OUTCOMES
from fencepost.runstore.rows import Attempt as Attempt
from fencepost.runstore.rows import AttemptPolicy as AttemptPolicy
from fencepost.runstore.rows import LivenessEvidence as LivenessEvidence
from fencepost.runstore.rows import RunFailure as RunFailure
from fencepost.runstore.rows import RunRow as RunRow
from fencepost.runstore.rows import RunSnapshot as RunSnapshot
from fencepost.runstore.store import RunStore as RunStore

__all__ = sorted(
    {
        "Attempt",
        "AttemptPolicy",
        "AttemptStore",
        "LivenessEvidence",
        "Outcome",
        "RunFailure",
        "RunRow",
        "RunSnapshot",
        "RunStore",
        *(cls.__name__ for cls in RUN_OUTCOMES + ATTEMPT_OUTCOMES),
    }
)
