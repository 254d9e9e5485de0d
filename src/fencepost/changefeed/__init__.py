"""Revision source, tombstones, keyset pages, snapshots and the live tail."""

from fencepost.changefeed.feed import ChangeFeed

__all__ = ["ChangeFeed"]
