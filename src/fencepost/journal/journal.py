"""``store.journal``: fenced and unfenced appends, reads (built out by the journal issue)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fencepost._store import Store


class Journal:
    def __init__(self, store: Store) -> None:
        self._store = store
