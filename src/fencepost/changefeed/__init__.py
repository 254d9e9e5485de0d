"""Revision source, tombstones, keyset pages, snapshots and the live tail (SPEC 6, REFERENCE 4).

``__all__`` here is what ``fencepost`` re-exports from the change feed.
"""

from fencepost.changefeed.feed import ChangeFeed
from fencepost.changefeed.types import (
    Acknowledgement,
    Batch,
    Cancellation,
    Change,
    ChangeBatch,
    ChangePage,
    Missing,
    Observed,
    Position,
    RunPage,
    StopSignal,
    Waiting,
    is_newer,
)

__all__ = [
    "Acknowledgement",
    "Batch",
    "Cancellation",
    "Change",
    "ChangeBatch",
    "ChangeFeed",
    "ChangePage",
    "Missing",
    "Observed",
    "Position",
    "RunPage",
    "StopSignal",
    "Waiting",
    "is_newer",
]
