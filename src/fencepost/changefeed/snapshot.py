"""Decoding stored rows into snapshots, failing closed (REFERENCE 4, ``ExecutionSnapshot.read``).

A row that breaks an invariant the store maintains (the owner invariant, a revision above the
watermark, a parent that is the run itself ...) is never passed on half-understood: the whole call
fails with ``decode_failed``, naming the rule broken, never the value.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

from fencepost._values import is_safe_int, parse_json_text
from fencepost.changefeed.types import Acknowledgement, Cancellation, Observed, Waiting
from fencepost.errors import RunStoreError
from fencepost.journal.owner import OwnerId
from fencepost.runstore._checks import decode_run_state
from fencepost.runstore._sql import RUN_COLUMNS as STORED_RUN_COLUMNS

STORED_COLUMNS = len(STORED_RUN_COLUMNS)
STATUSES = frozenset({"pending", "running", "suspended", "completed", "failed", "cancelled"})
SOURCE_SHAPE = re.compile(r"[0-9a-f]{32}")

# Upstream's waiting kinds; "event" is the older name of "signal", anything else is "other".
_KINDS = {
    "timer": "timer",
    "signal": "signal",
    "event": "signal",
    "approval": "approval",
    "quota": "quota",
    "human": "human",
}


class Corrupt(Exception):
    """Internal: a stored row or position broke a rule; ``str()`` names the rule only."""


def check_position(source: object, revision: object) -> None:
    """Refuse a malformed stored position (source not 32 lowercase hex, revision not a safe int)."""
    if type(source) is not str or not SOURCE_SHAPE.fullmatch(source):
        raise Corrupt("stored source is not 32 lowercase hex characters")
    if not is_safe_int(revision):
        raise Corrupt("stored revision is not a non-negative safe integer")


def _opt_ms(value: object, field: str) -> int | None:
    if value is None:
        return None
    if not is_safe_int(value):
        raise Corrupt(f"{field} is not a non-negative safe integer")
    return value


def decode_run(row: Any, source: str, watermark: int) -> Observed:
    """Turn one snapshot-read or listing row into an ``Observed`` at its own change revision.

    The run's own columns go through the run store's decoder (``runs.get`` refuses exactly the rows
    refused here, for the same rule); only the change row and the waiting columns, which ``runs.get``
    does not read, are checked here.
    """
    stored, (reason, token, wake, request_json, revision, deleted) = row[:STORED_COLUMNS], row[STORED_COLUMNS:]
    if revision is None:
        raise Corrupt("live run has no change row")
    if deleted != 0:
        raise Corrupt("live run is marked deleted in flows_run_changes")
    if not is_safe_int(revision) or revision == 0:
        raise Corrupt("change revision is not a positive safe integer")
    if revision > watermark:
        raise Corrupt("change revision is above the source watermark")
    try:
        run, state = decode_run_state(stored, "read")
    except RunStoreError as exc:
        raise Corrupt(exc.detail) from None
    flow = state.get("flowName") if type(state) is dict else None
    return Observed(
        run.run_id,
        source,
        revision,
        run.status,
        flow if type(flow) is str else None,
        run.created_at_ms,
        run.started_at_ms,
        run.finished_at_ms,
        run.parent_run_id,
        run.lineage_id if run.lineage_id is not None else run.run_id,
        run.round_ordinal if run.round_ordinal is not None else 0,
        run.owner,
        _cancellation(run.cancel_requested_at_ms, run.cancel_acknowledgement),
        None if reason is None and wake is None and token is None and request_json is None
        else _waiting(reason, wake, token, request_json),
    )


def _cancellation(requested: int | None, ack: dict[str, Any] | None) -> Cancellation | None:
    # Both were checked by the run decoder (an acknowledgement needs a request and has its shape).
    if requested is None:
        return None
    if ack is None:
        return Cancellation(requested, None)
    owner = ack["owner"]
    return Cancellation(
        requested, Acknowledgement(ack["observedAtMs"], OwnerId(owner["hostId"], owner["pid"], owner["nonce"]))
    )


def _waiting(reason: str | None, wake_at: object, token: str | None, request_json: str | None) -> Waiting | None:
    wake = _opt_ms(wake_at, "waiting_wake_at_ms")
    if reason is None:
        if wake is not None or token is not None or request_json is not None:
            raise Corrupt("waiting fields are set without a waiting reason")
        return None
    if reason == "":
        raise Corrupt("waiting_reason is empty")
    if token == "":
        raise Corrupt("waiting_token is empty")
    request = None
    if request_json is not None:
        request, problem = parse_json_text(request_json)
        if problem:
            raise Corrupt(f"waiting_request {problem}")
    digest = hashlib.sha256(token.encode("utf-8")).hexdigest() if token is not None else None
    return Waiting(_KINDS.get(reason, "other"), reason, wake, digest, request)  # type: ignore[arg-type]


def _revision_ok(value: object, low: int, high: int) -> bool:
    return is_safe_int(value) and low <= value <= high


def check_batch(run_ids: Sequence[str], batch: Any) -> None:
    """Refuse an answer that does not describe one committed state for exactly ``run_ids``.

    Port of upstream's coherence check on a read's answer (UPSTREAM-TESTS C2): the batch position is
    well formed; there is one snapshot per requested id, in request order; each has the batch's
    source and a revision within bounds (an ``Observed`` in 1..watermark, a ``Missing`` in
    0..watermark). ``ChangeFeed.read`` runs it before answering; a failure is a defect of ours.
    """
    try:
        check_position(batch.source, batch.revision)
    except Corrupt:
        raise Corrupt("batch position is malformed") from None
    snapshots = batch.snapshots
    if len(snapshots) != len(run_ids):
        raise Corrupt("batch has a different number of snapshots than ids requested")
    watermark = batch.revision
    for run_id, snap in zip(run_ids, snapshots, strict=True):
        if snap.run_id != run_id:
            raise Corrupt("batch snapshots are not in request order")
        if snap.source != batch.source:
            raise Corrupt("a snapshot belongs to another source")
        low = 1 if isinstance(snap, Observed) else 0
        if not _revision_ok(snap.revision, low, watermark):
            raise Corrupt("a snapshot revision is outside its bounds")
