"""Cancellation intent and its acknowledgement (seed ``cancel-a-run.md``)."""

from __future__ import annotations

from typing import Any

import msgspec
from sqlalchemy.engine import Connection

from fencepost.journal.owner import OwnerId
from fencepost.runstore import _checks as check
from fencepost.runstore import _sql as q
from fencepost.runstore import metrics as m
from fencepost.runstore._base import (
    NOT_FOUND,
    StoreBase,
    o_params,
)
from fencepost.runstore.outcomes import (
    AlreadyRequested,
    CancelRequested,
    RequestCancelOutcome,
    Terminal,
)
from fencepost.runstore.rows import STATUSES, TERMINAL


class Cancellation(StoreBase):
    """The cancellation part of ``RunStore``: intent from anyone, acknowledgement by the owner."""

    def request_cancel(self, run_id: str, now_ms: int) -> RequestCancelOutcome:
        """Record cancellation intent (no owner needed, first writer wins).

        ``CancelRequested(now_ms)``, ``AlreadyRequested(original)``, ``Terminal(status)`` (nothing
        recorded on a settled run) or ``NotFound``. ``now_ms`` is request data, not a lease reading:
        it need only be a non-negative safe integer.
        """
        with m.Op("RunStore.requestCancel") as op:
            method = "request_cancel"
            check.run_id(run_id, method)
            now = check.timestamp(now_ms, method)
            op.identity(runId=run_id)

            def tx(conn: Connection) -> Any:
                if q.run(conn, q.REQUEST_CANCEL, {"run_id": run_id, "now": now}).fetchone() is not None:
                    return CancelRequested(now)
                row = q.run(conn, q.SELECT_CANCEL_STATE, {"run_id": run_id}).fetchone()
                if row is None:
                    return NOT_FOUND
                return _cancel_loss(run_id, row[0], row[1], method)

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    def request_cancel_lineage(self, run_id: str, now_ms: int) -> RequestCancelOutcome:
        """Record cancellation intent on every live round of ``run_id``'s lineage, atomically.

        Any newly written request gives ``CancelRequested(now_ms)``; otherwise a live round's
        existing request gives ``AlreadyRequested``, which beats ``Terminal`` (the status of the
        last terminal round); no member gives ``NotFound``. Terminal rounds are never rewritten.
        """
        with m.Op("RunStore.requestCancelLineage") as op:
            method = "request_cancel_lineage"
            check.run_id(run_id, method)
            now = check.timestamp(now_ms, method)
            op.identity(runId=run_id)

            def tx(conn: Connection) -> Any:
                if q.run(conn, q.REQUEST_CANCEL_LINEAGE, {"run_id": run_id, "now": now}).fetchall():
                    return CancelRequested(now)
                members = q.run(conn, q.LINEAGE_CANCEL_STATE, {"run_id": run_id}).fetchall()
                if not members:
                    return NOT_FOUND
                for rid, status, requested in members:
                    if status not in STATUSES:
                        raise check.decode_failed(method, "stored run has an unknown status",
                                                  {"runId": rid, "field": "status"})
                    if status in TERMINAL:
                        continue
                    if requested is not None:
                        return AlreadyRequested(requested)
                    raise check.refuse(method, "a live round refused the request", {
                        "runId": rid, "stage": "write-invariant"}, code="persistence_failed")
                return Terminal(members[-1][1])  # every round is terminal: the last one's status

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    def acknowledge_cancel(self, run_id: str, owner: OwnerId, now_ms: int) -> bool:
        """Record that ``owner`` observed the cancel request at ``now_ms``; the first record is kept.

        True when the run is running, owned by ``owner`` and has a request (again True on repeat,
        keeping the first acknowledgement); False otherwise.
        """
        with m.Op("RunStore.acknowledgeCancel") as op:
            method = "acknowledge_cancel"
            check.run_id(run_id, method)
            check.owner(owner, method)
            now = check.timestamp(now_ms, method)
            op.identity(runId=run_id, ownerHostId=owner.host_id)
            ack = msgspec.json.encode({"observedAtMs": now, "owner": owner.to_json()}).decode()
            p = o_params(owner)
            p.update(run_id=run_id, ack=ack)
            return self._write(method, lambda conn: q.run(conn, q.ACK_CANCEL, p).fetchone() is not None)


def _cancel_loss(run_id: str, status: Any, requested: Any, method: str) -> Any:
    if status not in STATUSES:
        raise check.decode_failed(method, "stored run has an unknown status", {"runId": run_id, "field": "status"})
    if status in TERMINAL:
        return Terminal(status)
    if requested is not None:
        return AlreadyRequested(requested)
    raise check.refuse(method, "a live run refused the request",
                       {"runId": run_id, "stage": "write-invariant"}, code="persistence_failed")
