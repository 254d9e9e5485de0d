"""Revision source, tombstones, keyset pages, snapshots and the live tail.

``__all__`` here is what ``fencepost`` re-exports from the change feed.
"""

from fencepost.changefeed.feed import ChangeFeed

__all__ = ["ChangeFeed"]
