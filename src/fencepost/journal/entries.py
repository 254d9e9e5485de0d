"""Journal entries, append inputs and append receipts (REFERENCE 3.1)."""

from __future__ import annotations

from typing import Any

import msgspec

from fencepost._values import MAXIMUM_JSON_DEPTH, SAFE_MAX, _nesting_exceeds, is_safe_int, text_problem
from fencepost.errors import JournalError


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


_decode_any = msgspec.json.Decoder()


def entry_from_row(row: Any, method: str) -> Entry:
    """A stored journal row as an ``Entry``, checked: ``decode_failed`` (for ``method``) naming the
    field and the entry's position, never what it holds."""
    # Where the row is (its position, the key verify reports too), so an auditor can find it;
    # never what it holds.
    where = f" (the entry at position {row.position})" if is_safe_int(row.position) else ""
    payload_json, meta_json = row.payload_json, row.meta_json
    # Nothing the journal appends nests deeper than the durable-value limit: a value that does was
    # stored by hand, and the decoder (and whatever walks the value after it) could run out of
    # stack on it (a bare RecursionError); it is the entry's decode failure, whatever the stack.
    if any(type(t) is str and t.count("[") + t.count("{") > MAXIMUM_JSON_DEPTH
           and _nesting_exceeds(t, MAXIMUM_JSON_DEPTH) for t in (payload_json, meta_json)):
        raise JournalError("decode_failed", method,
                           f"stored payload or meta exceeds the depth limit of {MAXIMUM_JSON_DEPTH}{where}")
    try:
        payload = _decode_any.decode(payload_json)
        meta = _decode_any.decode(meta_json)
    except (msgspec.DecodeError, TypeError, ValueError, RecursionError):
        raise JournalError("decode_failed", method,
                           f"stored payload or meta cannot be decoded as JSON{where}") from None
    for name in ("seq", "source_seq", "emitted_at_ms", "position"):
        v = getattr(row, name)
        if type(v) is not int:  # only on SQLite, stored past its CHECK constraints
            raise JournalError("decode_failed", method, f"stored {name} does not hold an integer{where}")
        if not (is_safe_int(v) and v < SAFE_MAX) and not (name in ("emitted_at_ms", "position") and v == SAFE_MAX):
            raise JournalError("decode_failed", method, f"stored {name} is outside the safe integer range{where}")
    for name in ("run_id", "event_id", "source_id", "event_type"):
        v = getattr(row, name)
        if type(v) is not str or text_problem(v):
            raise JournalError("decode_failed", method, f"stored {name} is not a valid identifier{where}")
    return Entry(
        run_id=row.run_id, seq=row.seq, event_id=row.event_id, source_id=row.source_id, source_seq=row.source_seq,
        emitted_at_ms=row.emitted_at_ms, event_type=row.event_type, payload=payload, meta=meta,
        position=row.position, entry_hash=row.entry_hash,
    )
