"""``store.runs``: the run-ownership contract, arbitrated by the consensus strategy (line A).

Every operation validates all of its inputs first (``invalid_run``, nothing written), then runs in
ONE serialized write transaction: it reads the run row under the writer lock, checks the seeds'
predicate (REFERENCE 2.2), asks the strategy (REFERENCE 3.4), mirrors the decision onto the row
and appends the granted transition as a ``flows.consensus.*`` fact on the run's companion stream.
Row, lease and fact commit together or not at all. Contention is returned as an outcome
(``fencepost.runstore.outcomes``); only defects raise ``RunStoreError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy.engine import Connection

from fencepost._durable import DbFailure, map_failure
from fencepost.errors import RunStoreError
from fencepost.journal import companion_stream
from fencepost.journal import consensus as cs
from fencepost.journal.owner import OwnerId
from fencepost.runstore import _checks as check
from fencepost.runstore import _sql as q
from fencepost.runstore import metrics as m
from fencepost.runstore.heartbeat import STALE_AFTER_MS
from fencepost.runstore.outcomes import (
    AbandonClaimOutcome,
    Abandoned,
    Activated,
    ActivateOutcome,
    AlreadyClaimed,
    AlreadyRequested,
    CancelRequested,
    ClaimAndOwnOutcome,
    ClaimChanged,
    Claimed,
    ClaimFresh,
    ClaimLost,
    ClaimOutcome,
    EvidenceRequired,
    FenceLost,
    GuardFailed,
    HeartbeatFresh,
    HeartbeatOutcome,
    LivenessUnconfirmed,
    NotFound,
    ReconfirmOutcome,
    RecoverClaimOutcome,
    Recovered,
    RequestCancelOutcome,
    SnapshotChanged,
    StealOutcome,
    Terminal,
    Transitioned,
    TransitionOutcome,
    Updated,
    snake_tag,
)
from fencepost.runstore.rows import STATUSES, TERMINAL, LivenessEvidence, RunRow, RunSnapshot

if TYPE_CHECKING:
    from fencepost._store import Store

_NOT_FOUND = NotFound()
_ALREADY_CLAIMED = AlreadyClaimed()
_HEARTBEAT_FRESH = HeartbeatFresh()
_SNAPSHOT_CHANGED = SnapshotChanged()
_EVIDENCE_REQUIRED = EvidenceRequired()
_LIVENESS_UNCONFIRMED = LivenessUnconfirmed()
_ACTIVATED = Activated()
_CLAIM_LOST = ClaimLost()
_CLAIM_FRESH = ClaimFresh()
_CLAIM_CHANGED = ClaimChanged()
_ABANDONED = Abandoned()
_RECOVERED = Recovered()
_FENCE_LOST = FenceLost()
_GUARD_FAILED = GuardFailed()
_TRANSITIONED = Transitioned()

SOURCE_ID = "flows.run-store"
_FACT_TYPES = {t: f"flows.consensus.{t}" for t in ("claimed", "activated", "released", "stolen", "expired")}

Expected = RunSnapshot | RunRow


def _o(owner: OwnerId) -> dict[str, Any]:
    return {"o_host": owner.host_id, "o_pid": owner.pid, "o_nonce": owner.nonce}


def _c(claimant: OwnerId) -> dict[str, Any]:
    return {"c_host": claimant.host_id, "c_pid": claimant.pid, "c_nonce": claimant.nonce}


def _owner_is(g: Any, i: int, owner: OwnerId | None) -> bool:
    """Columns ``g[i:i+3]`` hold exactly ``owner`` (all NULL for None)."""
    if owner is None:
        return g[i] is None and g[i + 1] is None and g[i + 2] is None
    return g[i] == owner.host_id and g[i + 1] == owner.pid and g[i + 2] == owner.nonce


# SELECT_GUARDED columns: 0 status, 1-3 owner, 4 heartbeat, 5-7 claimant, 8 claimed_at_ms.
def _matches(g: Any, status: str, owner: OwnerId | None, hb: int | None) -> bool:
    return g[0] == status and g[4] == hb and _owner_is(g, 1, owner)


def _no_claim(g: Any) -> bool:
    return g[5] is None and g[6] is None and g[7] is None and g[8] is None


def _classify(g: Any, now_ms: int) -> Any:
    """Name a lost claim from the row (REFERENCE 2.1): absent, claimed, fresh, else moved."""
    if g is None:
        return _NOT_FOUND
    if g[5] is not None:
        return _ALREADY_CLAIMED
    if g[0] == "running" and g[4] is not None and g[4] >= now_ms - STALE_AFTER_MS:
        return _HEARTBEAT_FRESH
    return _SNAPSHOT_CHANGED


def _token_is(g: Any, claimant: OwnerId, claimed_at_ms: int) -> bool:
    return _owner_is(g, 5, claimant) and g[8] == claimed_at_ms


class RunStore:
    """Runs, their ownership and their cancellation; see the module docstring for the contract."""

    MAXIMUM_RUN_JSON_DEPTH = 128
    MAXIMUM_RUN_JSON_NODES = 100_000

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = store.db
        self._clock = store.clock

    # ------------------------------------------------------------------ plumbing
    @property
    def _consensus(self) -> Any:
        return self._store.consensus

    def _write(self, method: str, fn: Callable[[Connection], Any]) -> Any:
        try:
            return self._db.write(fn)
        except DbFailure as exc:
            err = map_failure(exc, RunStoreError, method, "run")
            err.cause = {"category": exc.category, "code": exc.code}  # type: ignore[attr-defined]
            raise err from None

    def _read(self, method: str, fn: Callable[[Connection], Any]) -> Any:
        try:
            return self._db.read(fn)
        except DbFailure as exc:
            err = map_failure(exc, RunStoreError, method, "run")
            err.cause = {"category": exc.category, "code": exc.code}  # type: ignore[attr-defined]
            raise err from None

    def _fact(self, conn: Connection, run_id: str, kind: str, owner: OwnerId, granted_at_ms: int | None) -> None:
        # Companion facts ride the journal's one append path, inside this same transaction.
        self._store.journal.append_in(
            conn, companion_stream(run_id), _FACT_TYPES[kind],
            {"runId": run_id, "owner": owner.to_json(), "grantedAtMs": granted_at_ms},
            source_id=SOURCE_ID, meta={"runId": run_id},
        )

    def _lease_now(self, now_ms: object, method: str) -> int:
        return check.lease_now(now_ms, self._clock.now_ms(), method)

    # ------------------------------------------------------------------ rows
    def create(self, run_id: str, state_json: str, *, parent_run_id: str | None = None,
               lineage_id: str | None = None, round_ordinal: int | None = None) -> None:
        """Insert a ``pending`` run with ``state_json`` stored byte for byte.

        ``created_at_ms`` comes from the store clock. ``lineage_id`` and ``round_ordinal`` come
        together or not at all. Raises ``invalid_run`` for bad input (including a run id with the
        companion-stream prefix) and ``constraint`` for a duplicate id, a missing parent or a
        duplicate ``(lineage_id, round_ordinal)``.
        """
        with m.Op("RunStore.create") as op:
            method = "create"
            check.run_id(run_id, method)
            check.not_companion(run_id, method)
            check.state_json(state_json, method, run_id)
            if parent_run_id is not None:
                check.run_id(parent_run_id, method, "parent_run_id")
            if (lineage_id is None) != (round_ordinal is None):
                raise check.refuse(method, "lineage_id and round_ordinal come together or not at all",
                                   {"field": "lineage_id"})
            if lineage_id is not None:
                check.run_id(lineage_id, method, "lineage_id")
                check.timestamp(round_ordinal, method, "round_ordinal")
            op.identity(runId=run_id)
            params = {"run_id": run_id, "state_json": state_json, "now": self._clock.now_ms(),
                      "parent_run_id": parent_run_id, "lineage_id": lineage_id, "round_ordinal": round_ordinal}
            self._write(method, lambda conn: q.run(conn, q.INSERT_RUN, params))

    def get(self, run_id: str) -> RunRow:
        """Read one run, decoded strictly: ``not_found_row`` if absent, ``decode_failed`` if corrupt."""
        with m.Op("RunStore.get") as op:
            check.run_id(run_id, "get")
            op.identity(runId=run_id)
            row = self._read("get", lambda conn: q.run(conn, q.SELECT_RUN, {"run_id": run_id}).fetchone())
            if row is None:
                raise check.refuse("get", "no run with this id", {"field": "runId"}, code="not_found_row")
            return check.decode_run(row, "get")

    def lineage(self, run_id: str) -> list[RunRow]:
        """Every round of ``run_id``'s logical run, in round order; ``[]`` for an unknown id.

        The lineage is ``L = lineage_id or run_id`` of the named row; members are rows whose
        ``lineage_id`` is ``L`` and the row ``L`` itself. Fork parentage alone does not join lineages.
        """
        with m.Op("RunStore.lineage") as op:
            check.run_id(run_id, "lineage")
            op.identity(runId=run_id)
            rows = self._read("lineage", lambda conn: q.run(conn, q.LINEAGE_ROWS, {"run_id": run_id}).fetchall())
            return [check.decode_run(r, "lineage") for r in rows]

    def latest_round(self, run_id: str) -> RunRow:
        """The highest round of ``run_id``'s lineage, else the named row (``not_found_row`` if absent)."""
        with m.Op("RunStore.latestRound") as op:
            check.run_id(run_id, "latest_round")
            op.identity(runId=run_id)

            def read(conn: Connection) -> Any:
                row = q.run(conn, q.LATEST_ROUND, {"run_id": run_id}).fetchone()
                return row if row is not None else q.run(conn, q.SELECT_RUN, {"run_id": run_id}).fetchone()

            row = self._read("latest_round", read)
            if row is None:
                raise check.refuse("latest_round", "no run with this id", {"field": "runId"}, code="not_found_row")
            return check.decode_run(row, "latest_round")

    # ------------------------------------------------------------------ claims
    def claim(self, run_id: str, expected: Expected, claimant: OwnerId, now_ms: int) -> ClaimOutcome:
        """Reserve a ``pending`` or ``suspended`` run that still matches ``expected``.

        Returns ``Claimed(claimed_at_ms=now_ms)`` (the token for ``activate``), or the loss:
        ``NotFound``, ``AlreadyClaimed``, ``HeartbeatFresh``, ``SnapshotChanged``. Records
        ``claimed`` on success; a refused claim records nothing.
        """
        with m.Op("RunStore.claim", m.claims, "claim") as op:
            method = "claim"
            check.run_id(run_id, method)
            status, own, hb = check.snapshot(expected, method)
            check.owner(claimant, method, "claimant")
            now = self._lease_now(now_ms, method)
            op.identity(runId=run_id, claimantHostId=claimant.host_id)

            def tx(conn: Connection) -> Any:
                g = q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone()
                if g is None or not (g[0] in ("pending", "suspended") and _matches(g, status, own, hb)
                                     and _no_claim(g)):
                    return _classify(g, now)
                d = self._consensus.claim(conn, run_id, claimant, now)
                if not isinstance(d, cs.Claimed):
                    return _classify(g, now)
                q.run(conn, q.SET_CLAIM, {"run_id": run_id, "claimed_at": d.granted_at_ms, **_c(claimant)})
                self._fact(conn, run_id, "claimed", claimant, d.granted_at_ms)
                return Claimed(d.granted_at_ms)

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    def claim_and_own(self, run_id: str, expected: Expected, owner: OwnerId, now_ms: int,
                      evidence: LivenessEvidence | None = None) -> ClaimAndOwnOutcome:
        """Claim and activate in one compare-and-swap (``pending``, ``suspended`` or stale ``running``).

        Replacing a different running owner needs matching ``evidence`` (else ``EvidenceRequired``
        while the snapshot is current, or the loss). A fresh running row is ``HeartbeatFresh`` even
        for its own owner. Records ``claimed`` (or ``released`` + ``claimed`` when re-owning the
        caller's own stale run, or ``stolen``) then ``activated``.
        """
        with m.Op("RunStore.claimAndOwn", m.claims, "claim_and_own") as op:
            method = "claim_and_own"
            check.run_id(run_id, method)
            status, own, hb = check.snapshot(expected, method)
            check.owner(owner, method)
            now = self._lease_now(now_ms, method)
            ev = check.evidence(evidence, method, required=False)
            op.identity(runId=run_id, ownerHostId=owner.host_id)

            if status == "running" and own != owner and not cs.evidence_matches(ev, own, owner, now):
                # Pre-gate: nothing is written without evidence against a different owner.
                g = self._read(method, lambda conn: q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone())
                loss = _classify(g, now)
                if loss is _SNAPSHOT_CHANGED and _matches(g, status, own, hb) and _no_claim(g):
                    loss = _EVIDENCE_REQUIRED
                op.done(loss)
                return loss

            def tx(conn: Connection) -> Any:
                g = q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone()
                if g is None or not (_matches(g, status, own, hb) and _no_claim(g)) or (
                        status == "running" and g[4] >= now - STALE_AFTER_MS):
                    return _classify(g, now)
                strategy = self._consensus
                if own is None:
                    d, kind = strategy.claim(conn, run_id, owner, now), "claimed"
                elif own == owner:
                    strategy.release(conn, run_id, owner)
                    self._fact(conn, run_id, "released", owner, None)
                    d, kind = strategy.claim(conn, run_id, owner, now), "claimed"
                else:
                    d, kind = strategy.steal(conn, run_id, owner, now, ev), "stolen"
                if not isinstance(d, cs.Claimed):
                    return _classify(g, now)
                grant = d.granted_at_ms
                if not isinstance(strategy.activate(conn, run_id, owner, grant, now), cs.Activated):
                    strategy.release(conn, run_id, owner)
                    return _classify(g, now)
                self._fact(conn, run_id, kind, owner, grant)
                self._fact(conn, run_id, "activated", owner, grant)
                q.run(conn, q.SET_RUNNING, {"run_id": run_id, "started": now, "hb": now, **_o(owner)})
                return _ACTIVATED

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    def activate(self, run_id: str, claimant: OwnerId, claimed_at_ms: int, expected: Expected) -> ActivateOutcome:
        """Trade the claim token ``(claimant, claimed_at_ms)`` for ownership.

        ``Activated`` sets ``running``, the owner and the first heartbeat (store clock) and clears the
        claim. ``ClaimLost`` when the row's claim is not this token (or the strategy lost it);
        ``SnapshotChanged`` when the claim is intact but the row moved: the claim is released
        (``released`` recorded) so the next sweeper is not blocked.
        """
        with m.Op("RunStore.activate", m.claims, "activate") as op:
            method = "activate"
            check.run_id(run_id, method)
            check.owner(claimant, method, "claimant")
            token = check.timestamp(claimed_at_ms, method, "claimed_at_ms")
            status, own, hb = check.snapshot(expected, method)
            op.identity(runId=run_id, claimantHostId=claimant.host_id)

            def tx(conn: Connection) -> Any:
                g = q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone()
                if g is None or not _token_is(g, claimant, token):
                    return _CLAIM_LOST
                strategy = self._consensus
                if not _matches(g, status, own, hb):
                    strategy.release(conn, run_id, claimant)
                    self._fact(conn, run_id, "released", claimant, token)
                    q.run(conn, q.CLEAR_CLAIM, {"run_id": run_id})
                    return _SNAPSHOT_CHANGED
                now = self._clock.now_ms()
                if not isinstance(strategy.activate(conn, run_id, claimant, token, now), cs.Activated):
                    q.run(conn, q.CLEAR_CLAIM, {"run_id": run_id})
                    return _CLAIM_LOST
                q.run(conn, q.SET_RUNNING, {"run_id": run_id, "started": now, "hb": now, **_o(claimant)})
                self._fact(conn, run_id, "activated", claimant, token)
                return _ACTIVATED

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    def abandon_claim(self, run_id: str, claimant: OwnerId, claimed_at_ms: int) -> AbandonClaimOutcome:
        """Release the claim ``(claimant, claimed_at_ms)``: ``Abandoned`` (``released`` recorded) or ``ClaimLost``."""
        with m.Op("RunStore.abandonClaim", m.claims, "abandon_claim") as op:
            method = "abandon_claim"
            check.run_id(run_id, method)
            check.owner(claimant, method, "claimant")
            token = check.timestamp(claimed_at_ms, method, "claimed_at_ms")
            op.identity(runId=run_id, claimantHostId=claimant.host_id)

            def tx(conn: Connection) -> Any:
                p = {"run_id": run_id, "claimed_at": token, **_c(claimant)}
                if q.run(conn, q.CLEAR_CLAIM_IF_TOKEN, p).fetchone() is None:
                    return _CLAIM_LOST
                self._consensus.release(conn, run_id, claimant)
                self._fact(conn, run_id, "released", claimant, token)
                return _ABANDONED

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    def recover_claim(self, run_id: str, stale_claimant: OwnerId, claimed_at_ms: int, observer: OwnerId,
                      now_ms: int, evidence: LivenessEvidence) -> RecoverClaimOutcome:
        """Clear a claim older than the staleness cutoff, on evidence about its claimant.

        ``LivenessUnconfirmed`` (nothing tried) unless ``evidence`` matches ``stale_claimant`` for
        ``observer`` at ``now_ms``; then ``NotFound``, ``ClaimChanged`` (not this token),
        ``ClaimFresh`` (claimed at or after ``now_ms - 30 s``) or ``Recovered`` (``expired`` recorded).
        """
        with m.Op("RunStore.recoverClaim", m.claims, "recover_claim") as op:
            method = "recover_claim"
            check.run_id(run_id, method)
            check.owner(stale_claimant, method, "stale_claimant")
            token = check.timestamp(claimed_at_ms, method, "claimed_at_ms")
            check.owner(observer, method, "observer")
            now = self._lease_now(now_ms, method)
            ev = check.evidence(evidence, method, required=True)
            op.identity(runId=run_id, observerHostId=observer.host_id)
            if not cs.evidence_matches(ev, stale_claimant, observer, now):
                op.done(_LIVENESS_UNCONFIRMED)
                return _LIVENESS_UNCONFIRMED

            def tx(conn: Connection) -> Any:
                g = q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone()
                if g is None:
                    return _NOT_FOUND
                if not _token_is(g, stale_claimant, token):
                    return _CLAIM_CHANGED
                if token >= now - STALE_AFTER_MS:
                    return _CLAIM_FRESH
                d = self._consensus.recover(conn, run_id, stale_claimant, token, observer, now, ev)
                if not isinstance(d, cs.Recovered):
                    return _CLAIM_FRESH if getattr(d, "reason", None) == "claim_fresh" else _CLAIM_CHANGED
                q.run(conn, q.CLEAR_CLAIM, {"run_id": run_id})
                self._fact(conn, run_id, "expired", stale_claimant, token)
                return _RECOVERED

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    def steal(self, run_id: str, expected: Expected, claimant: OwnerId, now_ms: int,
              evidence: LivenessEvidence) -> StealOutcome:
        """Reserve a stale running run on evidence; the caller follows with ``activate``.

        ``LivenessUnconfirmed`` (nothing tried) unless ``expected`` is running and ``evidence``
        matches its owner for ``claimant`` at ``now_ms``. Then the row must still match ``expected``,
        be stale and carry no claim: ``Claimed(now_ms)`` (``stolen`` recorded; status, owner and
        heartbeat stay, so the same ``expected`` activates) or the claim losses.
        """
        with m.Op("RunStore.steal", m.claims, "steal") as op:
            method = "steal"
            check.run_id(run_id, method)
            status, own, hb = check.snapshot(expected, method)
            check.owner(claimant, method, "claimant")
            now = self._lease_now(now_ms, method)
            ev = check.evidence(evidence, method, required=True)
            op.identity(runId=run_id, claimantHostId=claimant.host_id)
            if status != "running" or not cs.evidence_matches(ev, own, claimant, now):
                op.done(_LIVENESS_UNCONFIRMED)
                return _LIVENESS_UNCONFIRMED

            def tx(conn: Connection) -> Any:
                g = q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone()
                if g is None or not (_matches(g, status, own, hb) and _no_claim(g) and hb < now - STALE_AFTER_MS):
                    return _classify(g, now)
                d = self._consensus.steal(conn, run_id, claimant, now, ev)
                if not isinstance(d, cs.Claimed):
                    return _classify(g, now)
                q.run(conn, q.SET_CLAIM, {"run_id": run_id, "claimed_at": d.granted_at_ms, **_c(claimant)})
                self._fact(conn, run_id, "stolen", claimant, d.granted_at_ms)
                return Claimed(d.granted_at_ms)

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    # ------------------------------------------------------------------ leases
    def heartbeat(self, run_id: str, owner: OwnerId, now_ms: int) -> HeartbeatOutcome:
        """Renew ``owner``'s lease: ``Updated`` (stamp ``max(stored, now_ms)``), ``FenceLost``, ``NotFound``.

        A late reading that moves nothing is still ``Updated``: the fence held. Nothing is journaled.
        """
        with m.Op("RunStore.heartbeat", m.heartbeats) as op:
            method = "heartbeat"
            check.run_id(run_id, method)
            check.owner(owner, method)
            now = self._lease_now(now_ms, method)
            op.identity(runId=run_id, ownerHostId=owner.host_id)
            outcome = self._write(method, lambda conn: self._renew(conn, run_id, owner, now, reconfirm=False))
            op.done(outcome)
            return outcome

    def reconfirm(self, run_id: str, owner: OwnerId, now_ms: int) -> ReconfirmOutcome:
        """Renew as ``heartbeat`` does, but only while no peer has reserved the lease (no claim).

        Called by supervision once the write tolerance has expired: a stealer that reserved the
        stale lease wins even before it activates.
        """
        with m.Op("RunStore.reconfirm", m.heartbeats) as op:
            method = "reconfirm"
            check.run_id(run_id, method)
            check.owner(owner, method)
            now = self._lease_now(now_ms, method)
            op.identity(runId=run_id, ownerHostId=owner.host_id)
            outcome = self._write(method, lambda conn: self._renew(conn, run_id, owner, now, reconfirm=True))
            op.done(outcome)
            return outcome

    def _renew(self, conn: Connection, run_id: str, owner: OwnerId, now: int, *, reconfirm: bool) -> Any:
        strategy = self._consensus
        d = (strategy.reconfirm if reconfirm else strategy.heartbeat)(conn, run_id, owner, now)
        if isinstance(d, cs.Renewed):
            p = _o(owner)
            p["run_id"] = run_id
            p["hb"] = d.heartbeat_at_ms
            row = q.run(conn, q.HEARTBEAT_RUN, p).fetchone()
            if row is not None:
                return Updated(row[0])
        # Lease lost, or lease and row disagree: the row decides between gone and taken.
        return _FENCE_LOST if q.run(conn, q.RUN_EXISTS, {"run_id": run_id}).fetchone() else _NOT_FOUND

    def heartbeat_many(self, owner: OwnerId, run_ids: Iterable[str], now_ms: int) -> dict[str, HeartbeatOutcome]:
        """Renew ``owner``'s lease on many runs in ONE write transaction: ``{run_id: outcome}``.

        Per run, the outcome and effect are exactly those of ``heartbeat`` (lease renewed by the
        strategy, row mirrored, ``Updated``/``FenceLost``/``NotFound``), computed set-based: one
        lease statement, one row statement, one existence probe for the misses. Duplicate ids are
        answered once. Any invalid id refuses the whole batch before anything is written.
        """
        with m.Op("RunStore.heartbeatMany") as op:
            method = "heartbeat_many"
            check.owner(owner, method)
            now = self._lease_now(now_ms, method)
            if isinstance(run_ids, (str, bytes)) or not isinstance(run_ids, Iterable):
                raise check.refuse(method, "run_ids must be an iterable of run ids", {"field": "run_ids"})
            ids = list(dict.fromkeys(run_ids))
            for rid in ids:
                check.run_id(rid, method, "run_ids[]")
            op.identity(ownerHostId=owner.host_id, runCount=len(ids))
            if not ids:
                return {}
            outcome = self._write(method, lambda conn: self._renew_many(conn, owner, ids, now))
            counts: dict[str, int] = {}
            for o in outcome.values():
                label = snake_tag(o)
                counts[label] = counts.get(label, 0) + 1
            m.count_heartbeats(counts)
            return outcome

    def _renew_many(self, conn: Connection, owner: OwnerId, ids: list[str], now: int) -> dict[str, Any]:
        strategy = self._consensus
        encode = msgspec.json.encode
        many = getattr(strategy, "heartbeat_many", None)
        if many is not None:
            renewed = many(conn, owner, ids, now, encode(ids).decode())
        else:  # a strategy without a batch form: one call per run, same transaction
            renewed = {}
            for rid in ids:
                d = strategy.heartbeat(conn, rid, owner, now)
                if isinstance(d, cs.Renewed):
                    renewed[rid] = d.heartbeat_at_ms
        mirrored: dict[str, Any] = {}
        at_now = [rid for rid, stamp in renewed.items() if stamp == now]
        if at_now:
            p = _o(owner)
            p["ids"] = encode(at_now).decode()
            p["hb"] = now
            for rid, stamp in q.run(conn, q.HEARTBEAT_MANY_RUNS, p).fetchall():
                mirrored[rid] = Updated(stamp)
        for rid, stamp in renewed.items():
            if stamp != now:  # the lease was ahead of this reading: mirror its own stamp
                p = _o(owner)
                p["run_id"] = rid
                p["hb"] = stamp
                row = q.run(conn, q.HEARTBEAT_RUN, p).fetchone()
                if row is not None:
                    mirrored[rid] = Updated(row[0])
        misses = [rid for rid in ids if rid not in mirrored]
        if misses:
            existing = {r[0] for r in q.run(conn, q.EXISTING_IDS, {"ids": encode(misses).decode()}).fetchall()}
            for rid in misses:
                mirrored[rid] = _FENCE_LOST if rid in existing else _NOT_FOUND
        return {rid: mirrored[rid] for rid in ids}

    # ------------------------------------------------------------------ transitions
    def transition_owned(self, run_id: str, owner: OwnerId, to: str, state_json: str | None = None,
                         guard: dict[str, str] | None = None) -> TransitionOutcome:
        """Move a run ``owner`` holds to ``to`` (never ``pending``), optionally rewriting ``state_json``.

        ``running`` keeps the owner and rewrites only the state. ``suspended`` clears owner,
        heartbeat and claim; ``completed``/``failed``/``cancelled`` also stamp ``finished_at_ms``
        (store clock). ``cancel_requested_at_ms`` is never touched. ``guard`` is
        ``{"cancel_requested": "absent" | "present"}``, compiled into the same UPDATE as the fence.
        Outcomes: ``Transitioned``, ``NotFound``, ``FenceLost`` (the strategy or the row says another
        owner), ``GuardFailed`` (owned, guard refused). Leaving ``running`` releases the lease and
        records ``released``.
        """
        with m.Op("RunStore.transitionOwned", m.transitions) as op:
            method = "transition_owned"
            op.to = to if type(to) is str and to in STATUSES else "invalid"
            check.run_id(run_id, method)
            check.owner(owner, method)
            if type(to) is not str or to not in STATUSES:
                raise check.refuse(method, "to is not a run status", {"field": "to"})
            if to == "pending":
                raise check.refuse(method, "a run never goes back to pending", {"field": "to"})
            if state_json is not None:
                check.state_json(state_json, method, run_id)
            g_code = check.guard(guard, method)
            op.identity(runId=run_id, to=to, ownerHostId=owner.host_id)

            def tx(conn: Connection) -> Any:
                strategy = self._consensus
                if strategy.guard(conn, run_id, owner):
                    p = _o(owner)
                    p.update(run_id=run_id, state_json=state_json, guard=g_code)
                    if to == "running":
                        hit = q.run(conn, q.TRANSITION_RUNNING, p).fetchone()
                    else:
                        p["to"] = to
                        p["finished"] = self._clock.now_ms() if to in TERMINAL else None
                        hit = q.run(conn, q.TRANSITION_SETTLE, p).fetchone()
                    if hit is not None:
                        if to != "running":
                            strategy.release(conn, run_id, owner)
                            self._fact(conn, run_id, "released", owner, None)
                            if to in TERMINAL:
                                self._db.after_commit(_count_throughput)
                        return _TRANSITIONED
                    held = True
                else:
                    held = False
                row = q.run(conn, q.SELECT_FENCE_STATE, {"run_id": run_id}).fetchone()
                if row is None:
                    return _NOT_FOUND
                if not held or row[0] != "running" or not _owner_is(row, 1, owner):
                    return _FENCE_LOST
                return _GUARD_FAILED

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    # ------------------------------------------------------------------ cancellation
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
                    return _NOT_FOUND
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
                    return _NOT_FOUND
                last_terminal = None
                for rid, status, requested in members:
                    if status not in STATUSES:
                        raise check.decode_failed(method, "stored run has an unknown status",
                                                  {"runId": rid, "field": "status"})
                    if status in TERMINAL:
                        last_terminal = status
                    elif requested is not None:
                        return AlreadyRequested(requested)
                    else:
                        raise check.refuse(method, "a live round refused the request", {
                            "runId": rid, "stage": "write-invariant"}, code="persistence_failed")
                return Terminal(last_terminal)

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
            p = _o(owner)
            p.update(run_id=run_id, ack=ack)
            return self._write(method, lambda conn: q.run(conn, q.ACK_CANCEL, p).fetchone() is not None)

    # ------------------------------------------------------------------ stubs
    @staticmethod
    def noop(**overrides: Callable[..., Any]) -> NoopRunStore:
        """A store that persists nothing and says so (seed ``layerNoop``), with optional overrides.

        ``create``, ``get``, ``lineage``, ``latest_round`` and ``request_cancel_lineage`` raise
        ``persistence_failed``; every compare-and-swap reports its loss (``NotFound``, or
        ``ClaimLost`` for ``activate`` and ``abandon_claim``); ``acknowledge_cancel`` is False.
        """
        return NoopRunStore(**overrides)


def _count_throughput() -> None:
    m.throughput.add(1)


def _cancel_loss(run_id: str, status: Any, requested: Any, method: str) -> Any:
    if status not in STATUSES:
        raise check.decode_failed(method, "stored run has an unknown status", {"runId": run_id, "field": "status"})
    if status in TERMINAL:
        return Terminal(status)
    if requested is not None:
        return AlreadyRequested(requested)
    raise check.refuse(method, "a live run refused the request",
                       {"runId": run_id, "stage": "write-invariant"}, code="persistence_failed")


def _failing(method: str) -> Callable[..., Any]:
    def fail(*_a: Any, **_k: Any) -> Any:
        raise check.refuse(method, "no run store is composed (noop)", {}, code="persistence_failed")
    return fail


def _answer(value: Any) -> Callable[..., Any]:
    return lambda *_a, **_k: value


class NoopRunStore:
    """The explicit absence of a run store; see ``RunStore.noop``."""

    MAXIMUM_RUN_JSON_DEPTH = RunStore.MAXIMUM_RUN_JSON_DEPTH
    MAXIMUM_RUN_JSON_NODES = RunStore.MAXIMUM_RUN_JSON_NODES
    _METHODS = (
        "create", "get", "lineage", "latest_round", "request_cancel", "request_cancel_lineage",
        "acknowledge_cancel", "claim", "activate", "abandon_claim", "claim_and_own", "recover_claim",
        "steal", "heartbeat", "heartbeat_many", "reconfirm", "transition_owned",
    )

    def __init__(self, **overrides: Callable[..., Any]) -> None:
        for name in ("create", "get", "lineage", "latest_round", "request_cancel_lineage"):
            setattr(self, name, _failing(name))
        for name in ("request_cancel", "claim", "claim_and_own", "recover_claim", "steal", "heartbeat",
                     "reconfirm", "transition_owned"):
            setattr(self, name, _answer(_NOT_FOUND))
        self.activate = _answer(_CLAIM_LOST)
        self.abandon_claim = _answer(_CLAIM_LOST)
        self.acknowledge_cancel = _answer(False)
        self.heartbeat_many = lambda owner, run_ids, now_ms: dict.fromkeys(run_ids, _NOT_FOUND)
        for name, fn in overrides.items():
            if name not in self._METHODS:
                raise TypeError(f"RunStore.noop: unknown operation {name!r}")
            setattr(self, name, fn)
