"""fencepost: durable run state with fenced ownership, a journal, a change feed and projections."""

from __future__ import annotations

from fencepost import changefeed as _changefeed
from fencepost import runstore as _runstore
from fencepost._store import Store
from fencepost._store import open as open
from fencepost.changefeed import *  # noqa: F403 - re-exported by design, listed in its __all__
from fencepost.errors import (
    AttemptStoreError,
    FencepostError,
    JournalError,
    RunStoreError,
    SourceChanged,
)
from fencepost.journal.owner import OwnerId
from fencepost.runstore import *  # noqa: F403 - re-exported by design, listed in its __all__

__all__ = sorted(
    {
        "AttemptStoreError",
        "FencepostError",
        "JournalError",
        "OwnerId",
        "RunStoreError",
        "SourceChanged",
        "Store",
        "open",
        *_runstore.__all__,
        *_changefeed.__all__,
    }
)
