"""RunStore, AttemptStore, ownership supervision, heartbeat constants, outcomes, metrics.

``__all__`` here is what ``fencepost`` re-exports from the run store.
"""

from fencepost.runstore.attempts import AttemptStore
from fencepost.runstore.store import RunStore

__all__ = ["AttemptStore", "RunStore"]
