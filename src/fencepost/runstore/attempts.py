"""``store.attempts`` (built out by the run-store issue)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fencepost._store import Store


class AttemptStore:
    def __init__(self, store: Store, policy: Any = None) -> None:
        self._store = store
        self.policy = policy
