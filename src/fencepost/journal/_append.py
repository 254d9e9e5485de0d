"""The one append path: every journal write, fenced or not, companion fact or user entry.

Runs inside the caller's write transaction (a ``Connection`` from ``Database.write``), so an entry
commits or rolls back with the mutation it records. Sequences and positions are allocated here,
under the writer lock, which is what makes them gapless and in commit order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from fencepost._schema import flows_journal_events as ev
from fencepost._values import canonical_json, encode_json
from fencepost.errors import JournalError
from fencepost.journal.entries import Accepted, Duplicate

ZERO_HASH = "0" * 64

Redactor = Callable[[Any], Any]


def event_id_for(run_id: str, source_id: str, source_seq: int) -> str:
    """Deterministic, length-prefixed id: a retry of the same append produces the same id."""
    return f"flows:event:{len(run_id)}:{run_id}{len(source_id)}:{source_id}{source_seq}"


def content_hash(event_type: str, payload_json: str, meta_json: str) -> str:
    return hashlib.sha256(canonical_json([event_type, payload_json, meta_json])).hexdigest()


def entry_hash(row: dict[str, Any]) -> str:
    """Hash over an entry's canonical bytes, including both predecessors' hashes."""
    material = [
        row["run_id"], row["seq"], row["event_id"], row["source_id"], row["source_seq"],
        row["emitted_at_ms"], row["event_type"], row["payload_json"], row["meta_json"],
        row["position"], row["stream_prev_hash"], row["log_prev_hash"],
    ]
    return hashlib.sha256(canonical_json(material)).hexdigest()


_last_in_stream = (
    select(ev.c.seq, ev.c.entry_hash).where(ev.c.run_id == bindparam("run_id")).order_by(ev.c.seq.desc()).limit(1)
)
_last_in_log = select(ev.c.position, ev.c.entry_hash).order_by(ev.c.position.desc()).limit(1)


def append(
    conn: Connection,
    *,
    run_id: str,
    event_type: str,
    payload: Any,
    source_id: str,
    emitted_at_ms: int,
    source_seq: int | None = None,
    meta: Any = None,
    dedupe: str = "content",
    redact: Redactor | None = None,
) -> Accepted | Duplicate:
    """Append one entry inside ``conn``'s write transaction (inputs already validated)."""
    if redact is not None:
        payload = redact(payload)
        meta = redact(meta if meta is not None else {})
    payload_json = encode_json(payload)
    meta_json = encode_json(meta if meta is not None else {})
    chash = content_hash(event_type, payload_json, meta_json)

    if source_seq is None:
        last_source = conn.execute(
            select(func.max(ev.c.source_seq)).where(ev.c.run_id == run_id, ev.c.source_id == source_id)
        ).scalar()
        source_seq = 0 if last_source is None else int(last_source) + 1
    else:
        existing = conn.execute(
            select(ev.c.seq, ev.c.position, ev.c.content_hash).where(
                ev.c.run_id == run_id, ev.c.source_id == source_id, ev.c.source_seq == source_seq
            )
        ).first()
        if existing is not None:
            if dedupe == "content" and existing.content_hash != chash:
                raise JournalError(
                    "idempotency_conflict", "append", "an entry with this source sequence has other content"
                )
            return Duplicate(seq=int(existing.seq), source_seq=source_seq, position=int(existing.position))

    last = conn.execute(_last_in_stream, {"run_id": run_id}).first()
    seq = 0 if last is None else int(last.seq) + 1
    stream_prev = ZERO_HASH if last is None else last.entry_hash
    head = conn.execute(_last_in_log).first()
    position = 1 if head is None else int(head.position) + 1
    log_prev = ZERO_HASH if head is None else head.entry_hash

    row = {
        "run_id": run_id,
        "seq": seq,
        "event_id": event_id_for(run_id, source_id, source_seq),
        "source_id": source_id,
        "source_seq": source_seq,
        "emitted_at_ms": emitted_at_ms,
        "event_type": event_type,
        "payload_json": payload_json,
        "meta_json": meta_json,
        "content_hash": chash,
        "position": position,
        "stream_prev_hash": stream_prev,
        "log_prev_hash": log_prev,
    }
    row["entry_hash"] = entry_hash(row)
    conn.execute(ev.insert(), row)
    return Accepted(seq=seq, source_seq=source_seq, position=position)
