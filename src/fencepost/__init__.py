"""fencepost: durable run state with fenced ownership, a journal, a change feed and projections."""

from __future__ import annotations

from fencepost._store import Store
from fencepost._store import open as open  # noqa: A004 - the public entry point is fencepost.open
from fencepost.errors import (
    AttemptStoreError,
    FencepostError,
    JournalError,
    RunStoreError,
    SourceChanged,
)
from fencepost.journal.owner import OwnerId

__all__ = sorted(
    [
        "AttemptStoreError",
        "FencepostError",
        "JournalError",
        "OwnerId",
        "RunStoreError",
        "SourceChanged",
        "Store",
        "open",
    ]
)
