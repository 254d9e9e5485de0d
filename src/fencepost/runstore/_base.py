"""Shared plumbing of the run store's parts: transactions, error mapping, facts, row predicates.

``RunStore`` (``store.py``: rows, claims, transitions) is assembled with ``Leases`` (``leases.py``)
and ``Cancellation`` (``cancellation.py``); this module holds what they share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from fencepost._durable import DbFailure, map_failure
from fencepost.errors import FencepostError, RunStoreError
from fencepost.journal import companion_stream
from fencepost.journal import consensus as cs
from fencepost.journal.owner import OwnerId
from fencepost.runstore import _checks as check
from fencepost.runstore.heartbeat import STALE_AFTER_MS
from fencepost.runstore.outcomes import (
    Abandoned,
    Activated,
    AlreadyClaimed,
    ClaimChanged,
    ClaimFresh,
    ClaimLost,
    EvidenceRequired,
    FenceLost,
    GuardFailed,
    HeartbeatFresh,
    LivenessUnconfirmed,
    NotFound,
    Recovered,
    SnapshotChanged,
    Transitioned,
)
from fencepost.runstore.rows import RunRow, RunSnapshot

if TYPE_CHECKING:
    from fencepost._store import Store


MAXIMUM_RUN_JSON_DEPTH = 128
MAXIMUM_RUN_JSON_NODES = 100_000

# Field-less outcomes are immutable values: one shared instance each spares an allocation per call.
NOT_FOUND = NotFound()
ALREADY_CLAIMED = AlreadyClaimed()
HEARTBEAT_FRESH = HeartbeatFresh()
SNAPSHOT_CHANGED = SnapshotChanged()
EVIDENCE_REQUIRED = EvidenceRequired()
LIVENESS_UNCONFIRMED = LivenessUnconfirmed()
ACTIVATED = Activated()
CLAIM_LOST = ClaimLost()
CLAIM_FRESH = ClaimFresh()
CLAIM_CHANGED = ClaimChanged()
ABANDONED = Abandoned()
RECOVERED = Recovered()
FENCE_LOST = FenceLost()
GUARD_FAILED = GuardFailed()
TRANSITIONED = Transitioned()

SOURCE_ID = "flows.run-store"
FACT_TYPES = {t: f"flows.consensus.{t}" for t in ("claimed", "activated", "released", "stolen", "expired")}

Expected = RunSnapshot | RunRow


def o_params(owner: OwnerId) -> dict[str, Any]:
    return {"o_host": owner.host_id, "o_pid": owner.pid, "o_nonce": owner.nonce}


def c_params(claimant: OwnerId) -> dict[str, Any]:
    return {"c_host": claimant.host_id, "c_pid": claimant.pid, "c_nonce": claimant.nonce}


def owner_is(g: Any, i: int, owner: OwnerId | None) -> bool:
    """Columns ``g[i:i+3]`` hold exactly ``owner`` (all NULL for None)."""
    if owner is None:
        return g[i] is None and g[i + 1] is None and g[i + 2] is None
    return g[i] == owner.host_id and g[i + 1] == owner.pid and g[i + 2] == owner.nonce


# SELECT_GUARDED columns: 0 status, 1-3 owner, 4 heartbeat, 5-7 claimant, 8 claimed_at_ms.
def matches(g: Any, status: str, owner: OwnerId | None, hb: int | None) -> bool:
    return g[0] == status and g[4] == hb and owner_is(g, 1, owner)


def no_claim(g: Any) -> bool:
    return g[5] is None and g[6] is None and g[7] is None and g[8] is None


def classify(g: Any, now_ms: int) -> Any:
    """Name a lost claim from the row (REFERENCE 2.1): absent, claimed, fresh, else moved."""
    if g is None:
        return NOT_FOUND
    if g[5] is not None:
        return ALREADY_CLAIMED
    if g[0] == "running" and g[4] is not None and g[4] >= now_ms - STALE_AFTER_MS:
        return HEARTBEAT_FRESH
    return SNAPSHOT_CHANGED


def token_is(g: Any, claimant: OwnerId, claimed_at_ms: int) -> bool:
    return owner_is(g, 5, claimant) and g[8] == claimed_at_ms




def persistence_error(exc: DbFailure, method: str) -> FencepostError:
    """The ``RunStoreError`` a run-store ``method`` raises for the database failure ``exc`` (its
    category and code kept as ``cause``, never a value)."""
    err = map_failure(exc, RunStoreError, method, "run")
    err.cause = {"category": exc.category, "code": exc.code}  # type: ignore[attr-defined]
    return err

class StoreBase:
    """State and helpers shared by the parts of ``RunStore``."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = store.db
        self._clock = store.clock
        # Wrapped once (an injected strategy's answers are type-checked; the built-in one is not).
        self._consensus: Any = cs.checked(store.consensus)

    # ------------------------------------------------------------------ plumbing

    def _write(self, method: str, fn: Callable[[Connection], Any]) -> Any:
        try:
            return self._db.write(fn)
        except DbFailure as exc:
            raise persistence_error(exc, method) from None
        except (FencepostError, SQLAlchemyError):
            raise  # ours, or a transient driver error an outer write must see to retry
        except cs.StrategyAnswerError as exc:
            # Its message names the strategy's method and types only.
            raise check.refuse(method, str(exc), {"category": "persistence_failed", "reason": type(exc).__name__},
                               code="persistence_failed") from None
        except Exception as exc:
            # A defect inside an injected strategy: persistence_failed, its type kept, never its text
            # (it may quote values).
            raise check.refuse(method, "run persistence failed",
                               {"category": "persistence_failed", "reason": type(exc).__name__},
                               code="persistence_failed") from None

    def _read(self, method: str, fn: Callable[[Connection], Any]) -> Any:
        try:
            return self._db.read(fn)
        except DbFailure as exc:
            raise persistence_error(exc, method) from None

    def _fact(self, conn: Connection, run_id: str, kind: str, owner: OwnerId, granted_at_ms: int | None,
              **evidence: Any) -> None:
        """Append the consensus fact ``kind`` with the evidence the store decided on.

        ``evidence`` members by kind: ``activated`` ``heartbeatAtMs`` (the heartbeat stamped);
        ``stolen`` ``holder``, ``holderHeartbeatAtMs`` (the holder's heartbeat read), ``cutoffMs``
        (what it was compared with) and ``evidence`` (the kind); ``expired`` ``observer``,
        ``cutoffMs`` and ``evidence``; ``released`` may carry ``cause`` when the store dropped a
        claim its holder did not release itself.
        """
        payload: dict[str, Any] = {"runId": run_id, "owner": owner.to_json(), "grantedAtMs": granted_at_ms}
        for name, value in evidence.items():
            payload[name] = value.to_json() if isinstance(value, OwnerId) else value
        # Companion facts ride the journal's one append path, inside this same transaction.
        self._store.journal.append_in(
            conn, companion_stream(run_id), FACT_TYPES[kind], payload, source_id=SOURCE_ID, meta={"runId": run_id},
        )

    def _now(self, method: str) -> int:
        """The store clock's reading, refused by name (``invalid_run``, before anything is written)
        when it is no non-negative safe integer: a clock of one's own reading fractional or negative
        milliseconds would otherwise fail on a column's CHECK as a bare ``constraint``."""
        return check.clock_reading(self._clock, method)

    def _lease_now(self, now_ms: object, method: str) -> int:
        return check.lease_now(now_ms, self._now(method), method)
