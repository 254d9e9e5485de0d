"""Decoding stored rows into snapshots, failing closed (REFERENCE 4, ``ExecutionSnapshot.read``).

A row that breaks an invariant the store maintains (the owner invariant, a revision above the
watermark, a parent that is the run itself ...) is never passed on half-understood: the whole call
fails with ``decode_failed``, naming the rule broken, never the value.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec

from fencepost._values import is_safe_int, parse_json_text
from fencepost.changefeed.types import Acknowledgement, Cancellation, Observed, Waiting
from fencepost.journal.owner import OwnerId

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


class _FlowName(msgspec.Struct):
    flowName: Any = None  # the stored state's own key, spelled as upstream stores it


class _AckOwner(msgspec.Struct, rename="camel"):
    host_id: str
    pid: int
    nonce: str


class _AckJson(msgspec.Struct, rename="camel"):
    observed_at_ms: int
    owner: _AckOwner


_flow_decoder = msgspec.json.Decoder(_FlowName)
_ack_decoder = msgspec.json.Decoder(_AckJson)


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
    return value  # type: ignore[return-value]


def _flow_name(state_json: object) -> str | None:
    if type(state_json) is not str:
        raise Corrupt("state_json is not text")
    try:
        flow = _flow_decoder.decode(state_json).flowName
    except msgspec.ValidationError:
        # Valid JSON that is not an object: run state is the caller's, it need not name a flow.
        _, problem = parse_json_text(state_json)
        if problem:
            raise Corrupt(f"state_json {problem}") from None
        return None
    except msgspec.DecodeError:
        raise Corrupt("state_json is not valid JSON") from None
    return flow if type(flow) is str else None


def decode_run(row: Any, source: str, watermark: int) -> Observed:
    """Turn one snapshot-read or listing row into an ``Observed`` at its own change revision."""
    (run_id, status, state_json, created, started, finished, heartbeat, owner_host, owner_pid, owner_nonce,
     cancel_requested, ack_json, parent, lineage, ordinal, reason, token, wake, request_json,
     revision, deleted) = row
    if revision is None:
        raise Corrupt("live run has no change row")
    if deleted != 0:
        raise Corrupt("live run is marked deleted in flows_run_changes")
    if not is_safe_int(revision) or revision == 0:
        raise Corrupt("change revision is not a positive safe integer")
    if revision > watermark:
        raise Corrupt("change revision is above the source watermark")
    if status not in STATUSES:
        raise Corrupt("status is not a known run status")
    if status == "running":
        if owner_host is None or owner_pid is None or owner_nonce is None or heartbeat is None:
            raise Corrupt("owner invariant broken: running run without a full owner and heartbeat")
        if not owner_host or not owner_nonce or not is_safe_int(owner_pid) or not is_safe_int(heartbeat):
            raise Corrupt("owner invariant broken: malformed owner or heartbeat")
        owner: OwnerId | None = OwnerId(owner_host, owner_pid, owner_nonce)
    else:
        if owner_host is not None or owner_pid is not None or owner_nonce is not None or heartbeat is not None:
            raise Corrupt("owner invariant broken: owner or heartbeat on a run that is not running")
        owner = None
    if not is_safe_int(created):
        raise Corrupt("created_at_ms is not a non-negative safe integer")
    if parent is not None and (parent == run_id or parent == ""):
        raise Corrupt("parent_run_id is empty or the run itself")
    if (lineage is None) != (ordinal is None):
        raise Corrupt("lineage_id and round_ordinal must be set together")
    if lineage == "" or (ordinal is not None and not is_safe_int(ordinal)):
        raise Corrupt("lineage_id is empty or round_ordinal is not a safe integer")
    return Observed(
        run_id,
        source,
        revision,
        status,
        _flow_name(state_json),
        created,
        _opt_ms(started, "started_at_ms"),
        _opt_ms(finished, "finished_at_ms"),
        parent,
        lineage if lineage is not None else run_id,
        ordinal if ordinal is not None else 0,
        owner,
        None if cancel_requested is None and ack_json is None else _cancellation(cancel_requested, ack_json),
        None if reason is None and wake is None and token is None and request_json is None
        else _waiting(reason, wake, token, request_json),
    )


def _cancellation(requested_at: object, ack_json: str | None) -> Cancellation | None:
    requested = _opt_ms(requested_at, "cancel_requested_at_ms")
    if requested is None:
        if ack_json is not None:
            raise Corrupt("cancel acknowledgement without a cancel request")
        return None
    if ack_json is None:
        return Cancellation(requested, None)
    try:
        ack = _ack_decoder.decode(ack_json)
    except msgspec.DecodeError:
        raise Corrupt("cancel_acknowledgement_json does not have the acknowledgement shape") from None
    if not is_safe_int(ack.observed_at_ms) or not is_safe_int(ack.owner.pid):
        raise Corrupt("cancel acknowledgement holds an unsafe integer")
    return Cancellation(
        requested,
        Acknowledgement(ack.observed_at_ms, OwnerId(ack.owner.host_id, ack.owner.pid, ack.owner.nonce)),
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
    return is_safe_int(value) and low <= value <= high  # type: ignore[operator]


def check_batch(run_ids: list[str] | tuple[str, ...], batch: Any) -> None:
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
