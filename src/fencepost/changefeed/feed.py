"""``store.feed`` (built out by the change-feed issue)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fencepost._store import Store


class ChangeFeed:
    def __init__(self, store: Store) -> None:
        self._store = store
