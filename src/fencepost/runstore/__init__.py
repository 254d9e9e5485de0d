"""RunStore, AttemptStore, ownership supervision, heartbeat constants, outcomes, metrics."""

from fencepost.runstore.attempts import AttemptStore
from fencepost.runstore.store import RunStore

__all__ = ["AttemptStore", "RunStore"]
