"""fencepost: durable run state with fenced ownership, a journal, a change feed and projections."""

from __future__ import annotations

from fencepost import changefeed as _changefeed
from fencepost import runstore as _runstore
from fencepost._store import Store as Store
from fencepost._store import open as open
from fencepost.changefeed import *  # noqa: F403 - re-exported by design, listed in its __all__
from fencepost.errors import AttemptStoreError as AttemptStoreError
from fencepost.errors import FencepostError as FencepostError
from fencepost.errors import JournalError as JournalError
from fencepost.errors import OpenError as OpenError
from fencepost.errors import ProjectionError as ProjectionError
from fencepost.errors import RunAlreadyExists as RunAlreadyExists
from fencepost.errors import RunStoreError as RunStoreError
from fencepost.errors import SourceChanged as SourceChanged
from fencepost.journal.owner import OwnerId as OwnerId
from fencepost.runstore import *  # noqa: F403 - re-exported by design, listed in its __all__
from fencepost.shards import ShardChange as ShardChange
from fencepost.shards import ShardError as ShardError
from fencepost.shards import ShardSet as ShardSet
from fencepost.shards import open_shards as open_shards

# Written in the forms type checkers follow (a literal list, ``+=`` a subpackage's ``__all__``), so
# ``from fencepost import Claimed`` type-checks as it runs.
__all__ = [
    "AttemptStoreError",
    "FencepostError",
    "JournalError",
    "OpenError",
    "OwnerId",
    "ProjectionError",
    "RunAlreadyExists",
    "RunStoreError",
    "ShardChange",
    "ShardError",
    "ShardSet",
    "SourceChanged",
    "Store",
    "open",
    "open_shards",
]
__all__ += _runstore.__all__
__all__ += _changefeed.__all__
__all__.sort()
