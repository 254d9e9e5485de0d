"""Journal entries, append inputs and append receipts (REFERENCE 3.1)."""

from __future__ import annotations

from typing import Any

import msgspec


class Entry(msgspec.Struct, frozen=True):
    """One committed journal entry.

    ``seq`` counts from 0 per stream (``run_id``), gapless; ``position`` is global, gapless and in
    commit order. ``payload`` and ``meta`` are the redacted values that were stored.
    ``entry_hash`` chains the entry to its predecessors (see ``fencepost.journal.verify``).
    """

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


class NewEntry(msgspec.Struct, frozen=True):
    """One entry to append with ``Journal.append_many``: the per-entry part of an append."""

    event_type: str
    payload: Any
    meta: Any = None
    source_seq: int | None = None


class Receipt(msgspec.Struct, frozen=True, tag=True):
    """What an append did."""


class Accepted(Receipt, frozen=True):
    """The entry was appended at ``seq`` (and global ``position``)."""

    seq: int
    source_seq: int
    position: int


class Duplicate(Receipt, frozen=True):
    """An entry with the same ``(run_id, source_id, source_seq)`` was already committed.

    Nothing was written; ``seq``/``position`` are those of the entry that stands.
    """

    seq: int
    source_seq: int
    position: int
    status: str = "committed"


AppendReceipt = Accepted | Duplicate


class EntriesPage(msgspec.Struct, frozen=True):
    """One page of a stream: ``entries`` in ``seq`` order, ``has_more`` when a later page exists."""

    entries: list[Entry]
    has_more: bool
