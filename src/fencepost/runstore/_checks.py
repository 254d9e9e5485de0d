"""Input validation and strict row decoding for the run store.

Every refusal names the field and the rule (and lengths or flags), never the value: messages and
causes reach logs, spans and telemetry. Validation happens before the first statement, so bad input
writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypeVar, overload

import msgspec

from fencepost._values import (
    MAXIMUM_JSON_DEPTH,
    MAXIMUM_JSON_NODES,
    identifier_problem,
    is_safe_int,
    parse_json_text,
    text_problem,
)
from fencepost.errors import FencepostError, RunStoreError
from fencepost.journal import COMPANION_PREFIX
from fencepost.journal.owner import OwnerId, owner_problem
from fencepost.journal.redaction import redact_diagnostics
from fencepost.runstore.heartbeat import SKEW_ALLOWANCE_MS
from fencepost.runstore.rows import EVIDENCE_KINDS, STATUSES, LivenessEvidence, RunFailure, RunRow, RunSnapshot

TIMESTAMP_DETAIL = "must be a non-negative safe integer"


_E = TypeVar("_E", bound=FencepostError)

CLOCK_DETAIL = "clock reading must be a non-negative safe integer (milliseconds)"


def refuse(method: str, detail: str, cause: dict[str, Any] | None = None, *,
           code: str = "invalid_run", cls: type[_E] = RunStoreError) -> _E:  # type: ignore[assignment]
    err = cls(code, method, detail)
    err.cause = cause or {}  # type: ignore[attr-defined]
    return err


def clock_reading(clock: Any, method: str, *, code: str = "invalid_run",
                  cls: type[FencepostError] = RunStoreError) -> int:
    """The clock's reading, refused by name (``code``, before anything is written) when it is no
    non-negative safe integer: a clock of one's own reading fractional or negative milliseconds
    would otherwise fail on a column's CHECK as a bare ``constraint``."""
    now = clock.now_ms()
    if not is_safe_int(now):
        raise refuse(method, CLOCK_DETAIL, {"field": "clock"}, code=code, cls=cls)
    return now


def run_id(value: object, method: str, field: str = "run_id") -> str:
    p = identifier_problem(value)
    if p:
        raise refuse(method, f"{field} {p}", {"field": field})
    return value  # type: ignore[return-value]


def owner(value: object, method: str, field: str = "owner") -> OwnerId:
    p = owner_problem(value)
    if p:
        raise refuse(method, f"{field} {p}", {"field": field})
    return value  # type: ignore[return-value]


def timestamp(value: object, method: str, field: str = "now_ms") -> int:
    if not is_safe_int(value):
        raise refuse(method, f"{field} {TIMESTAMP_DETAIL}", {"field": field, "detail": TIMESTAMP_DETAIL})
    return value


def lease_now(value: object, clock_now_ms: int, method: str) -> int:
    """A lease reading: a safe integer at most ``SKEW_ALLOWANCE`` ahead of the store clock."""
    now = timestamp(value, method)
    if now > clock_now_ms + SKEW_ALLOWANCE_MS:
        raise refuse(method, f"now_ms is more than {SKEW_ALLOWANCE_MS} ms ahead of the store clock",
                     {"field": "now_ms", "detail": "exceeds the skew allowance",
                      "aheadMs": now - clock_now_ms})
    return now


def snapshot(expected: object, method: str) -> tuple[str, OwnerId | None, int | None]:
    """The three guarded fields of a ``RunSnapshot`` or a whole ``RunRow``, validated."""
    if type(expected) is not RunSnapshot and type(expected) is not RunRow:
        raise refuse(method, "expected must be a RunSnapshot or a RunRow", {"field": "expected"})
    status = expected.status
    own = expected.owner
    hb = expected.heartbeat_at_ms
    if type(status) is not str or status not in STATUSES:
        raise refuse(method, "expected.status is not a run status", {"field": "expected.status"})
    if own is not None:
        p = owner_problem(own)
        if p:
            raise refuse(method, f"expected.owner {p}", {"field": "expected.owner"})
    if hb is not None and not is_safe_int(hb):
        raise refuse(method, f"expected.heartbeat_at_ms {TIMESTAMP_DETAIL}", {"field": "expected.heartbeat_at_ms"})
    if status == "running":
        if own is None or hb is None:
            raise refuse(method, "a running snapshot requires owner and heartbeat_at_ms",
                         {"field": "expected", "partial": True})
    elif own is not None or hb is not None:
        raise refuse(method, "a snapshot that is not running carries neither owner nor heartbeat_at_ms",
                     {"field": "expected", "partial": True})
    return status, own, hb


@overload
def evidence(value: object, method: str, *, required: Literal[True]) -> LivenessEvidence: ...


@overload
def evidence(value: object, method: str, *, required: bool) -> LivenessEvidence | None: ...


def evidence(value: object, method: str, *, required: bool) -> LivenessEvidence | None:
    if value is None:
        if required:
            raise refuse(method, "evidence is required", {"field": "evidence"})
        return None
    if type(value) is not LivenessEvidence:
        raise refuse(method, "evidence must be a LivenessEvidence", {"field": "evidence"})
    p = owner_problem(value.expected_owner)
    if p:
        raise refuse(method, f"evidence.expected_owner {p}", {"field": "evidence.expected_owner"})
    timestamp(value.checked_at_ms, method, "evidence.checked_at_ms")
    if type(value.kind) is not str or value.kind not in EVIDENCE_KINDS:
        raise refuse(method, "evidence.kind is not a known evidence kind", {"field": "evidence.kind"})
    return value


def many(value: object, method: str, field: str, what: str) -> list[Any]:
    """A batch argument as a list: any iterable except a string or bytes (``invalid_run`` otherwise)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise refuse(method, f"{field} must be an iterable of {what}", {"field": field})
    return list(value)


def state_json(text: object, method: str, rid: str | None, field: str = "state_json") -> str:
    _, problem = parse_json_text(text, max_depth=MAXIMUM_JSON_DEPTH, max_nodes=MAXIMUM_JSON_NODES)
    if problem:
        cause: dict[str, Any] = {"field": field, "stateJsonValid": False}
        if rid is not None:
            cause["runId"] = rid
        if type(text) is str:
            cause["stateJsonLength"] = len(text)
        raise refuse(method, f"{field} {problem}", cause)
    return text  # type: ignore[return-value]


def references(rid: str, parent: object, lineage: object, round_ordinal: object, method: str) -> None:
    """A new row's ``parent_run_id``, ``lineage_id`` and ``round_ordinal``, by ``decode_run``'s rules.

    Every rule the decoder applies to these columns is applied here first, so ``create`` cannot
    store a row that every read path would then refuse as ``decode_failed``; and neither id may use
    the companion-stream prefix (see ``not_companion``).
    """
    if parent is not None:
        not_companion(run_id(parent, method, "parent_run_id"), method, "parent_run_id")
        if parent == rid:
            raise refuse(method, "parent_run_id names the run itself", {"field": "parent_run_id"})
    if (lineage is None) != (round_ordinal is None):
        raise refuse(method, "lineage_id and round_ordinal come together or not at all", {"field": "lineage_id"})
    if lineage is not None:
        not_companion(run_id(lineage, method, "lineage_id"), method, "lineage_id")
        timestamp(round_ordinal, method, "round_ordinal")


def not_companion(rid: str, method: str, field: str = "run_id") -> None:
    """Refuse an id in the journal's reserved companion-stream namespace (``flows.companion/``).

    Run ids, and the ids a run names (its parent, its lineage: retry mints ``<lineage>.retry-<n>``
    and journals onto the lineage's stream), must stay out of it.
    """
    if rid.startswith(COMPANION_PREFIX):
        # The run id's cause keeps the name OT-08 gives it (runId).
        raise refuse(method, f"{field} uses the reserved companion-stream prefix",
                     {"field": "runId" if field == "run_id" else field})


_GUARDS = {"absent": 1, "present": 2}


def guard(value: object, method: str) -> int:
    """0 for no guard, 1 for ``cancel_requested: absent``, 2 for ``present``."""
    if value is None:
        return 0
    if type(value) is not dict:
        raise refuse(method, "guard must be a dict", {"field": "guard"})
    if not value:
        return 0
    if set(value) != {"cancel_requested"} or type(value["cancel_requested"]) is not str or (
            value["cancel_requested"] not in _GUARDS):
        raise refuse(method, 'guard accepts only cancel_requested: "absent" or "present"', {"field": "guard"})
    return _GUARDS[value["cancel_requested"]]


def decode_failed(method: str, detail: str, cause: dict[str, Any]) -> RunStoreError:
    return refuse(method, detail, cause, code="decode_failed")


def _opt_int(v: object) -> bool:
    return v is None or is_safe_int(v)


def decode_run(row: Any, method: str) -> RunRow:
    """Decode a full ``flows_runs`` row strictly; a row that breaks any invariant is ``decode_failed``."""
    return decode_run_state(row, method)[0]


def decode_run_state(row: Any, method: str) -> tuple[RunRow, Any]:
    """The one run-row decoder: ``(RunRow, decoded state value)``, or ``decode_failed`` naming the rule.

    ``runs.get``, the change feed's snapshot reads and the listing all decode through it, so a row
    is refused (or accepted) by every read path alike. The state is parsed once, under the durable
    limits every write enforces (depth, nodes, no NUL or lone surrogate, escaped or not).
    """
    (rid, status, state, created, started, finished, hb, o_host, o_pid, o_nonce, c_host, c_pid, c_nonce,
     claimed_at, cancel_at, ack_json, parent, lineage, round_ordinal, failure_json) = row
    # Plain comparisons, not generators: every snapshot read and listing row comes through here.
    has_owner = o_host is not None or o_pid is not None or o_nonce is not None
    has_claim = c_host is not None or c_pid is not None or c_nonce is not None or claimed_at is not None

    def fail(detail: str, **extra: Any) -> RunStoreError:
        cause: dict[str, Any] = {"runId": rid, "hasOwnerColumns": has_owner, "hasClaimColumns": has_claim}
        cause.update(extra)
        cause.setdefault("stateJsonValid", _state_ok(state))
        return decode_failed(method, f"stored run {detail}", cause)

    if identifier_problem(rid):
        raise fail("has an invalid run_id")
    if type(status) is not str or status not in STATUSES:
        raise fail("has an unknown status", field="status")
    if not is_safe_int(created):
        raise fail(f"created_at_ms {TIMESTAMP_DETAIL}", field="created_at_ms")
    if not (_opt_int(started) and _opt_int(finished) and _opt_int(hb) and _opt_int(claimed_at)
            and _opt_int(cancel_at) and _opt_int(round_ordinal)):
        for name, v in (("started_at_ms", started), ("finished_at_ms", finished), ("heartbeat_at_ms", hb),
                        ("claimed_at_ms", claimed_at), ("cancel_requested_at_ms", cancel_at),
                        ("round_ordinal", round_ordinal)):
            if not _opt_int(v):
                raise fail(f"{name} {TIMESTAMP_DETAIL}", field=name)
    own: OwnerId | None = None
    if has_owner:
        own = OwnerId(o_host, o_pid, o_nonce)
        if owner_problem(own):
            raise fail("has incomplete or invalid owner columns", field="owner")
    if status == "running":
        if own is None or hb is None:
            raise fail("is running without an owner and a heartbeat", field="owner")
    elif own is not None or hb is not None:
        raise fail("carries owner columns but is not running", field="owner")
    claimant: OwnerId | None = None
    if has_claim:
        if claimed_at is None:
            raise fail("has incomplete claim columns", field="claim")
        claimant = OwnerId(c_host, c_pid, c_nonce)
        if owner_problem(claimant):
            raise fail("has incomplete or invalid claim columns", field="claim")
    value, p = parse_json_text(state, max_depth=MAXIMUM_JSON_DEPTH, max_nodes=MAXIMUM_JSON_NODES)
    if p:
        raise fail("state_json is not valid durable JSON", field="state_json", stateJsonValid=False)
    ack = None
    if ack_json is not None:
        ack, p = parse_json_text(ack_json)
        if p or type(ack) is not dict:
            raise fail("cancel_acknowledgement_json is not a JSON object", field="cancel_acknowledgement_json")
        if cancel_at is None:
            raise fail("has an acknowledgement without a cancel request", field="cancel_acknowledgement_json")
        if not _ack_shape_ok(ack):
            raise fail("cancel_acknowledgement_json does not have the acknowledgement shape",
                       field="cancel_acknowledgement_json")
    if parent is not None and (identifier_problem(parent) or parent == rid):
        raise fail("has an invalid parent_run_id (empty, malformed or the run itself)", field="parent_run_id")
    if lineage is not None and identifier_problem(lineage):
        raise fail("has an invalid lineage_id", field="lineage_id")
    if (lineage is None) != (round_ordinal is None):
        raise fail("has only one of lineage_id and round_ordinal", field="lineage_id")
    failure = None
    if failure_json is not None:
        if status != "failed":
            raise fail("carries a failure but did not fail", field="failure_json")
        try:
            failure = _failure_decoder.decode(failure_json)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise fail("failure_json is not a failure object", field="failure_json") from None
    return RunRow(rid, status, state, created, started, finished, hb, own, claimant, claimed_at, cancel_at,
                  ack, parent, lineage, round_ordinal, failure), value


_failure_decoder = msgspec.json.Decoder(RunFailure)
_failure_encoder = msgspec.json.Encoder()


def failure(value: object, method: str, to: str, redact: Any) -> str | None:
    """The ``failure_json`` to write: only with ``to="failed"``, redacted, then bounded."""
    if value is None:
        return None
    if to != "failed":
        raise refuse(method, "failure is recorded only when a run settles failed", {"field": "failure"})
    if type(value) is not RunFailure or not all(
            type(v) is str for v in (value.type, value.message, value.traceback)):
        raise refuse(method, "failure must be a RunFailure of three strings", {"field": "failure"})
    fields = {"type": value.type, "message": value.message, "traceback": value.traceback}
    for name, text in fields.items():
        p = text_problem(text)
        if p:
            raise refuse(method, f"failure.{name} {p}", {"field": f"failure.{name}"})
    if redact is not None:
        redacted: object
        try:
            redacted = redact_diagnostics(redact, fields)
        except Exception:  # the redactor's own error may quote the text: never pass it on
            redacted = None
        if type(redacted) is not dict or not all(type(redacted.get(k)) is str for k in fields):
            raise refuse(method, "failure could not be redacted", {"field": "failure"})
        fields = redacted
    cleaned = RunFailure(fields["type"], fields["message"], fields["traceback"]).bounded()
    return _failure_encoder.encode(cleaned).decode()


_OWNER_KEYS = frozenset(("hostId", "pid", "nonce"))


def _ack_shape_ok(ack: dict[str, Any]) -> bool:
    # What ``acknowledge_cancel`` writes: {"observedAtMs": ms, "owner": {"hostId", "pid", "nonce"}}.
    owner = ack.get("owner")
    if not is_safe_int(ack.get("observedAtMs")) or type(owner) is not dict or not _OWNER_KEYS <= owner.keys():
        return False
    return owner_problem(OwnerId(owner["hostId"], owner["pid"], owner["nonce"])) is None


def _state_ok(state: object) -> bool:
    _, p = parse_json_text(state, max_depth=MAXIMUM_JSON_DEPTH, max_nodes=MAXIMUM_JSON_NODES)
    return p is None
