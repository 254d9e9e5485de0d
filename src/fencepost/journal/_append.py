"""The one append path: every journal write, fenced or not, companion fact or user entry.

Runs inside the caller's write transaction (a ``Connection`` from ``Database.write``), so an entry
commits or rolls back with the mutation it records. Sequences and positions are allocated here,
under the writer lock, which is what makes them gapless and in commit order. Payload and meta are
redacted, checked and encoded *before* any sequence is allocated, so a refused entry leaves no gap.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from fencepost._statements import run, run_many
from fencepost._values import SAFE_MAX, canonical_json, json_equal, parse_json_text, value_problem
from fencepost.errors import JournalError
from fencepost.journal._sql import EXISTING, HEADS, INSERT
from fencepost.journal.entries import Accepted, Duplicate, NewEntry
from fencepost.journal.redaction import NotDurable, Redaction

ZERO_HASH = "0" * 64
#: Container edges a payload or meta may nest (REFERENCE 3.6 ``maxDepth``).
MAXIMUM_DEPTH = 256
#: Nodes a payload or meta may hold; bounds the work of one append, not its bytes.
MAXIMUM_NODES = 1_000_000

Redactor = Callable[[Any], Any]


def event_id_for(run_id: str, source_id: str, source_seq: int) -> str:
    """Deterministic, length-prefixed id: a retry of the same append produces the same id."""
    return f"flows:event:{len(run_id)}:{run_id}{len(source_id)}:{source_id}{source_seq}"


def content_hash(event_type: str, payload_json: str, meta_json: str) -> str:
    """SHA-256 over what an idempotent retry must repeat: type and the canonical payload/meta text."""
    return hashlib.sha256(canonical_json([event_type, payload_json, meta_json])).hexdigest()


def entry_hash(row: Mapping[str, Any]) -> str:
    """Hash over an entry's canonical bytes, including both predecessors' hashes."""
    return chain_hash(
        row["run_id"], row["seq"], row["event_id"], row["source_id"], row["source_seq"],
        row["emitted_at_ms"], row["event_type"], row["payload_json"], row["meta_json"],
        row["position"], row["stream_prev_hash"], row["log_prev_hash"],
    )


def chain_hash(*material: Any) -> str:
    """``entry_hash`` of the fields given in its order (the append path has them at hand, not in a row)."""
    return hashlib.sha256(canonical_json(material)).hexdigest()


def prepare(value: Any, field: str, redact: Redactor | None, method: str = "append") -> str:
    """Redact ``value``, check it is a durable JSON value and return its canonical JSON text.

    A redactor that raises, or returns something that is not a durable value, is
    ``invalid_event`` naming only ``field``: the redactor's own error may quote the secret.
    """
    # Errors are raised outside the ``except`` blocks so the redactor's own exception (which may
    # quote the secret) is not even kept as ``__context__``.
    failure: str | None = None
    if redact is not None and (isinstance(redact, Redaction) or getattr(redact, "__func__", None) is Redaction.fact):
        # The built-in redactor (and its consensus-fact form) checks durability in the same walk:
        # nothing left to check.
        try:
            value = redact(value)
        except NotDurable as exc:
            failure = f"{field} could not be redacted: value {exc}"
        except Exception:
            failure = f"{field} could not be redacted"
        if failure is not None:
            raise JournalError("invalid_event", method, failure)
        return canonical_json(value).decode("utf-8")
    if redact is not None:
        try:
            value = redact(value)
        except Exception:
            failure = f"{field} could not be redacted"
        if failure is not None:
            raise JournalError("invalid_event", method, failure)
    problem = value_problem(value, max_depth=MAXIMUM_DEPTH, max_nodes=MAXIMUM_NODES)
    if problem is not None:
        verb = "redacted" if redact is not None else "canonicalized"
        raise JournalError("invalid_event", method, f"{field} could not be {verb}: value {problem}")
    # Stored as canonical (sorted-key) text: the stored bytes are the hashed bytes.
    return canonical_json(value).decode("utf-8")


def _same_content(row: Any, event_type: str, payload_json: str, meta_json: str) -> bool:
    # Equal text is the common case; otherwise compare as JSON (1 == 1.0, true != 1).
    if row[3] != event_type:
        return False
    if row[4] == payload_json and row[5] == meta_json:
        return True
    stored_p, p1 = parse_json_text(row[4], max_depth=MAXIMUM_DEPTH, max_nodes=MAXIMUM_NODES)
    stored_m, p2 = parse_json_text(row[5], max_depth=MAXIMUM_DEPTH, max_nodes=MAXIMUM_NODES)
    new_p, _ = parse_json_text(payload_json, max_depth=MAXIMUM_DEPTH, max_nodes=MAXIMUM_NODES)
    new_m, _ = parse_json_text(meta_json, max_depth=MAXIMUM_DEPTH, max_nodes=MAXIMUM_NODES)
    return p1 is None and p2 is None and json_equal(stored_p, new_p) and json_equal(stored_m, new_m)


def append_prepared(
    conn: Connection,
    *,
    run_id: str,
    source_id: str,
    emitted_at_ms: int,
    items: Sequence[tuple[str, str, str, int | None]],
    dedupe: str = "content",
    method: str = "append",
    heads: Sequence[Any] | None = None,
) -> list[Accepted | Duplicate]:
    """Append already prepared ``(event_type, payload_json, meta_json, source_seq)`` items to one stream.

    ``heads``: the head lookup's row when the caller already read it in this transaction.

    One lookup for the heads, one per explicit ``source_seq`` for its identity, one multi-row
    insert; receipts in input order. An item whose identity exists (in the table or earlier in
    ``items``) is a ``Duplicate`` (same content, or any content with ``dedupe="identity"``) or
    ``idempotency_conflict``; a conflict raises before anything is inserted.
    """
    if heads is None:
        heads = run(conn, HEADS, {"run_id": run_id, "source_id": source_id}).fetchone()
    last_seq, stream_prev, last_pos, log_prev, source_max = heads
    seq = 0 if last_seq is None else int(last_seq) + 1
    position = 1 if last_pos is None else int(last_pos) + 1
    stream_prev = stream_prev or ZERO_HASH
    log_prev = log_prev or ZERO_HASH
    next_source = 0 if source_max is None else int(source_max) + 1

    receipts: list[Accepted | Duplicate] = []
    rows: list[tuple[Any, ...]] = []
    in_batch: dict[int, tuple[Any, ...]] = {}
    for event_type, payload_json, meta_json, source_seq in items:
        if source_seq is None:
            source_seq = next_source
            if source_seq >= SAFE_MAX:
                raise JournalError(
                    "invalid_event", method, "journal sequence is outside the allocatable safe integer range"
                )
        else:
            found = in_batch.get(source_seq)
            if found is None:
                found = run(
                    conn, EXISTING, {"run_id": run_id, "source_id": source_id, "source_seq": source_seq}
                ).fetchone()
            if found is not None:
                if dedupe == "content" and not _same_content(found, event_type, payload_json, meta_json):
                    raise JournalError(
                        "idempotency_conflict", method,
                        f"producer:{source_seq} already holds an entry with other content",
                    )
                receipts.append(Duplicate(seq=int(found[0]), source_seq=source_seq, position=int(found[1])))
                continue
        if seq >= SAFE_MAX or position > SAFE_MAX:
            raise JournalError(
                "invalid_event", method, "journal sequence is outside the allocatable safe integer range"
            )
        chash = content_hash(event_type, payload_json, meta_json)
        event_id = event_id_for(run_id, source_id, source_seq)
        h = chain_hash(run_id, seq, event_id, source_id, source_seq, emitted_at_ms, event_type, payload_json,
                       meta_json, position, stream_prev, log_prev)
        # In ``INSERT_FIELDS`` order (the table's column order).
        rows.append((run_id, seq, event_id, source_id, source_seq, emitted_at_ms, event_type, payload_json,
                     meta_json, chash, position, stream_prev, log_prev, h))
        if len(items) > 1:  # only a later item of the same batch can repeat this identity
            in_batch[source_seq] = (seq, position, chash, event_type, payload_json, meta_json)
        receipts.append(Accepted(seq, source_seq, position))
        stream_prev = log_prev = h
        seq += 1
        position += 1
        if source_seq >= next_source:
            next_source = source_seq + 1
    if len(rows) == 1:
        run(conn, INSERT, rows[0])
    elif rows:
        run_many(conn, INSERT, rows)
    return receipts


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
    """Append one entry inside ``conn``'s write transaction (identifiers already validated)."""
    payload_json = prepare(payload, "payload", redact)
    meta_json = prepare(meta if meta is not None else {}, "meta", redact)
    return append_prepared(
        conn, run_id=run_id, source_id=source_id, emitted_at_ms=emitted_at_ms,
        items=[(event_type, payload_json, meta_json, source_seq)], dedupe=dedupe,
    )[0]


def append_many(
    conn: Connection,
    *,
    run_id: str,
    source_id: str,
    emitted_at_ms: int,
    entries: Sequence[NewEntry],
    dedupe: str = "content",
    redact: Redactor | None = None,
) -> list[Accepted | Duplicate]:
    """Append several entries to one stream in ``conn``'s transaction with one multi-row insert."""
    items = [
        (
            e.event_type,
            prepare(e.payload, "payload", redact),
            prepare(e.meta if e.meta is not None else {}, "meta", redact),
            e.source_seq,
        )
        for e in entries
    ]
    return append_prepared(
        conn, run_id=run_id, source_id=source_id, emitted_at_ms=emitted_at_ms, items=items, dedupe=dedupe
    )
