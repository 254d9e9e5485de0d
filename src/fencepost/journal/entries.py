"""Journal entries and append receipts."""

from __future__ import annotations

from typing import Any

import msgspec


class Entry(msgspec.Struct, frozen=True):
    """One committed journal entry. ``position`` is global and gapless, in commit order."""

    run_id: str
    seq: int
    event_id: str
    source_id: str
    source_seq: int
    emitted_at_ms: int
    event_type: str
    payload: Any
    meta: Any
    position: int
    entry_hash: str


class Receipt(msgspec.Struct, frozen=True, tag=True):
    """What an append did."""


class Accepted(Receipt, frozen=True):
    """The entry was appended at ``seq`` (and global ``position``)."""

    seq: int
    source_seq: int
    position: int


class Duplicate(Receipt, frozen=True):
    """An entry with the same ``(run_id, source_id, source_seq)`` already exists."""

    seq: int
    source_seq: int
    position: int
    status: str = "duplicate"


class EntriesPage(msgspec.Struct, frozen=True):
    entries: list[Entry]
    has_more: bool
