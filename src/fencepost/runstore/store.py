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
from typing import Any

import msgspec
from sqlalchemy.engine import Connection

from fencepost.errors import RunAlreadyExists, RunStoreError
from fencepost.journal import COMPANION_PREFIX
from fencepost.journal import consensus as cs
from fencepost.journal.owner import OwnerId
from fencepost.runstore import _checks as check
from fencepost.runstore import _sql as q
from fencepost.runstore import metrics as m
from fencepost.runstore._base import (
    ABANDONED,
    ACTIVATED,
    CLAIM_CHANGED,
    CLAIM_FRESH,
    CLAIM_LOST,
    EVIDENCE_REQUIRED,
    FENCE_LOST,
    GUARD_FAILED,
    LIVENESS_UNCONFIRMED,
    MAXIMUM_RUN_JSON_DEPTH,
    MAXIMUM_RUN_JSON_NODES,
    NOT_FOUND,
    RECOVERED,
    SNAPSHOT_CHANGED,
    SOURCE_ID,
    TRANSITIONED,
    Expected,
    c_params,
    classify,
    matches,
    no_claim,
    o_params,
    owner_is,
    token_is,
)
from fencepost.runstore.cancellation import Cancellation
from fencepost.runstore.heartbeat import STALE_AFTER_MS
from fencepost.runstore.leases import Leases
from fencepost.runstore.noop import NoopRunStore
from fencepost.runstore.outcomes import (
    AbandonClaimOutcome,
    ActivateOutcome,
    ClaimAndOwnOutcome,
    Claimed,
    ClaimOutcome,
    RecoverClaimOutcome,
    StealOutcome,
    TransitionOutcome,
)
from fencepost.runstore.rows import STATUSES, TERMINAL, LivenessEvidence, RunFailure, RunRow

_OWNABLE = ("pending", "suspended", "running")
RETRIED = "flows.run-store.retried"
DELETED = "flows.run-store.deleted"


class RunStore(Leases, Cancellation):
    """Runs, their ownership and their cancellation; see the module docstring for the contract."""

    MAXIMUM_RUN_JSON_DEPTH = MAXIMUM_RUN_JSON_DEPTH
    MAXIMUM_RUN_JSON_NODES = MAXIMUM_RUN_JSON_NODES

    # ------------------------------------------------------------------ rows
    def create(self, run_id: str, state_json: str, *, parent_run_id: str | None = None,
               lineage_id: str | None = None, round_ordinal: int | None = None) -> None:
        """Insert a ``pending`` run with ``state_json`` stored byte for byte.

        ``created_at_ms`` comes from the store clock. ``lineage_id`` and ``round_ordinal`` come
        together or not at all. Raises ``invalid_run`` for bad input (including a run, parent or
        lineage id with the companion-stream prefix, or a ``parent_run_id`` that is the run itself)
        and ``constraint`` for a duplicate id (as ``RunAlreadyExists``: "a run with this id already
        exists"), a missing parent ("parent_run_id names no run") or a duplicate
        ``(lineage_id, round_ordinal)`` ("that round of the lineage already exists").
        """
        with m.Op("RunStore.create") as op:
            method = "create"
            check.run_id(run_id, method)
            check.not_companion(run_id, method)
            check.state_json(state_json, method, run_id)
            check.references(run_id, parent_run_id, lineage_id, round_ordinal, method)
            op.identity(runId=run_id)
            params = {"run_id": run_id, "state_json": state_json, "now": self._now(method),
                      "parent_run_id": parent_run_id, "lineage_id": lineage_id, "round_ordinal": round_ordinal}
            self._insert(method, [params], single=True)

    def create_many(self, runs: Iterable[tuple[str, str]]) -> int:
        """Insert ``(run_id, state_json)`` pairs as ``pending`` runs, all in one transaction, or none.

        Every pair is validated first (``invalid_run`` naming ``runs[i].field``; ``runs`` itself when
        it is not an iterable, or is a string). A run id that
        already exists, or appears twice, is refused naming ``runs[i]``; nothing is
        written then (``RunAlreadyExists``, code ``constraint``). Returns the number of runs created.
        """
        with m.Op("RunStore.createMany") as op:
            method = "create_many"
            items = check.many(runs, method, "runs", "(run_id, state_json) pairs")
            now = self._now(method)
            params: list[dict[str, Any]] = []
            seen: dict[str, int] = {}
            for i, item in enumerate(items):
                if type(item) is not tuple or len(item) != 2:
                    raise check.refuse(method, f"runs[{i}] must be a (run_id, state_json) pair",
                                       {"field": f"runs[{i}]"})
                run_id, state_json = item
                check.run_id(run_id, method, f"runs[{i}].run_id")
                check.not_companion(run_id, method, f"runs[{i}].run_id")
                check.state_json(state_json, method, run_id, f"runs[{i}].state_json")
                if run_id in seen:
                    raise check.refuse(method, f"runs[{i}]: a run with this id already exists (runs[{seen[run_id]}])",
                                       {"field": f"runs[{i}].run_id"}, code="constraint", cls=RunAlreadyExists)
                seen[run_id] = i
                params.append({"run_id": run_id, "state_json": state_json, "now": now, "parent_run_id": None,
                               "lineage_id": None, "round_ordinal": None})
            op.identity(runs=len(params))
            if params:
                self._insert(method, params, single=False)
            return len(params)

    def _insert(self, method: str, params: list[dict[str, Any]], *, single: bool) -> None:
        # The constraints (a taken id, a missing parent, a taken lineage round) are looked up inside
        # the write transaction, under the writer lock, and refused by name (``constraint``). A
        # violation that still races past (another writer outside fencepost) is looked up again
        # after the rollback and named the same way.
        def tx(conn: Connection) -> None:
            taken = _taken(conn, method, params, single)
            if taken is not None:
                raise taken
            for p in params:
                q.run(conn, q.INSERT_RUN, p)

        try:
            self._write(method, tx)
        except RunStoreError as exc:
            if exc.code != "constraint" or isinstance(exc, RunAlreadyExists):
                raise
            taken = self._read(method, lambda conn: _taken(conn, method, params, single))
            if taken is not None:
                raise taken from None
            raise

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

    # ------------------------------------------------------------------ operator operations
    def retry(self, run_id: str, *, new_run_id: str | None = None) -> RunRow:
        """Start a new round of ``run_id``'s lineage from the state its latest round ended with.

        The new run is ``pending`` with ``lineage_id`` = the lineage, ``round_ordinal`` = the latest
        round's + 1, ``parent_run_id`` = the latest round and that round's ``state_json`` (its last
        checkpoint, or the state it settled with). Its id is ``new_run_id``, else
        ``"<lineage>.retry-<round>"``. One transaction reads the lineage, inserts the round and
        journals ``flows.run-store.retried`` on the lineage's stream. ``refused`` while the latest
        round is live (pending, running, suspended), while any round of the lineage carries a
        cancellation request, or when the lineage id has the companion-stream prefix (a row stored
        before ``create`` refused one); ``not_found_row`` for an unknown id; ``RunAlreadyExists`` if the new
        id is taken.
        """
        with m.Op("RunStore.retry") as op:
            method = "retry"
            check.run_id(run_id, method)
            if new_run_id is not None:
                check.run_id(new_run_id, method, "new_run_id")
                check.not_companion(new_run_id, method, "new_run_id")
            op.identity(runId=run_id)

            def tx(conn: Connection) -> RunRow:
                rows = [check.decode_run(r, method) for r in q.run(conn, q.LINEAGE_ROWS, {"run_id": run_id})]
                if not rows:
                    raise check.refuse(method, "no run with this id", {"field": "runId"}, code="not_found_row")
                if any(r.cancel_requested_at_ms is not None for r in rows):
                    raise check.refuse(method, "the lineage has a cancellation request", {"field": "runId"},
                                       code="refused")
                latest = max(rows, key=lambda r: (r.round_ordinal or 0, r.run_id))
                if latest.status not in TERMINAL:
                    raise check.refuse(method, f"the lineage's latest round is still live ({latest.status})",
                                       {"field": "runId", "status": latest.status}, code="refused")
                lineage = latest.lineage_id or latest.run_id
                if lineage.startswith(COMPANION_PREFIX):
                    # A row stored before create refused such a lineage_id: retrying it would mint a
                    # reserved run id and journal onto a companion stream.
                    raise check.refuse(method, "the lineage's lineage_id uses the reserved companion-stream prefix",
                                       {"field": "lineage_id"}, code="refused")
                ordinal = (latest.round_ordinal or 0) + 1
                rid = new_run_id if new_run_id is not None else f"{lineage}.retry-{ordinal}"
                check.run_id(rid, method, "new_run_id")
                if q.run(conn, q.RUN_EXISTS, {"run_id": rid}).fetchone() is not None:
                    raise _already_exists(method, None)
                q.run(conn, q.INSERT_RUN, {"run_id": rid, "state_json": latest.state_json, "now": self._now(method),
                                           "parent_run_id": latest.run_id, "lineage_id": lineage,
                                           "round_ordinal": ordinal})
                self._store.journal.append_in(
                    conn, lineage, RETRIED,
                    {"runId": rid, "lineageId": lineage, "roundOrdinal": ordinal, "fromRunId": latest.run_id},
                    source_id=SOURCE_ID, meta={"runId": rid},
                )
                return check.decode_run(q.run(conn, q.SELECT_RUN, {"run_id": rid}).fetchone(), method)

            return self._write(method, tx)

    def delete(self, run_id: str, *, force: bool = False) -> None:
        """Delete a run and its attempts; the change feed reports it ``deleted`` (a tombstone).

        A run that is owned (``running``) or claimed is ``refused`` unless ``force=True``, which
        releases its lease (``released`` recorded) in the same transaction, so no lease outlives
        its run. A run other runs name as their parent is ``refused``. Journals
        ``flows.run-store.deleted`` on the run's stream (the journal itself is append-only and
        keeps the run's history). ``not_found_row`` for an unknown id.
        """
        with m.Op("RunStore.delete") as op:
            method = "delete"
            check.run_id(run_id, method)
            if type(force) is not bool:
                raise check.refuse(method, "force must be a bool", {"field": "force"})
            op.identity(runId=run_id)

            def tx(conn: Connection) -> None:
                g = q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone()
                if g is None:
                    raise check.refuse(method, "no run with this id", {"field": "runId"}, code="not_found_row")
                if q.run(conn, q.HAS_CHILDREN, {"run_id": run_id}).fetchone() is not None:
                    raise check.refuse(method, "the run is the parent of other runs; delete them first",
                                       {"field": "runId"}, code="refused")
                owner = OwnerId(g[1], g[2], g[3]) if g[1] is not None else None
                claimant = OwnerId(g[5], g[6], g[7]) if g[5] is not None else None
                if (owner is not None or claimant is not None) and not force:
                    raise check.refuse(method,
                                       "the run is running or claimed; force=True releases its lease and deletes it",
                                       {"field": "runId", "status": g[0]}, code="refused")
                for holder in (owner, claimant):
                    if holder is not None:
                        self._consensus.release(conn, run_id, holder)
                        self._fact(conn, run_id, "released", holder, None)
                q.run(conn, q.DELETE_ATTEMPTS, {"run_id": run_id})
                q.run(conn, q.DELETE_RUN, {"run_id": run_id})
                self._store.journal.append_in(conn, run_id, DELETED,
                                              {"runId": run_id, "status": g[0], "forced": force},
                                              source_id=SOURCE_ID, meta={"runId": run_id})

            self._write(method, tx)

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
                if g is None or not (g[0] in ("pending", "suspended") and matches(g, status, own, hb)
                                     and no_claim(g)):
                    return classify(g, now)
                d = self._consensus.claim(conn, run_id, claimant, now)
                if not isinstance(d, cs.Claimed):
                    return classify(g, now)
                q.run(conn, q.SET_CLAIM, {"run_id": run_id, "claimed_at": d.granted_at_ms, **c_params(claimant)})
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
                loss = classify(g, now)
                if loss is SNAPSHOT_CHANGED and matches(g, status, own, hb) and no_claim(g):
                    loss = EVIDENCE_REQUIRED
                op.done(loss)
                return loss

            def tx(conn: Connection) -> Any:
                g = q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone()
                if g is None or g[0] not in _OWNABLE or not (matches(g, status, own, hb) and no_claim(g)) or (
                        status == "running" and g[4] >= now - STALE_AFTER_MS):
                    return classify(g, now)
                strategy = self._consensus
                if own == owner:
                    # Re-owning the caller's own stale run: release, then a fresh grant. In a
                    # savepoint, so a strategy that refuses the new grant leaves the old lease.
                    savepoint = conn.begin_nested()
                    strategy.release(conn, run_id, owner)
                    d = strategy.claim(conn, run_id, owner, now)
                    if not isinstance(d, cs.Claimed) or not isinstance(
                            strategy.activate(conn, run_id, owner, d.granted_at_ms, now), cs.Activated):
                        savepoint.rollback()
                        return classify(g, now)
                    savepoint.commit()
                    self._fact(conn, run_id, "released", owner, None)
                    kind = "claimed"
                else:
                    if own is None:
                        d, kind = strategy.claim(conn, run_id, owner, now), "claimed"
                    else:
                        d, kind = strategy.steal(conn, run_id, owner, now, ev), "stolen"
                    if not isinstance(d, cs.Claimed):
                        return classify(g, now)
                    if not isinstance(strategy.activate(conn, run_id, owner, d.granted_at_ms, now), cs.Activated):
                        strategy.release(conn, run_id, owner)  # compensate: the grant must not linger
                        return classify(g, now)
                grant = d.granted_at_ms
                if kind == "stolen":
                    assert ev is not None
                    self._fact(conn, run_id, "stolen", owner, grant, holder=own, holderHeartbeatAtMs=g[4],
                               cutoffMs=now - STALE_AFTER_MS, evidence=ev.kind)
                else:
                    self._fact(conn, run_id, "claimed", owner, grant)
                self._fact(conn, run_id, "activated", owner, grant, heartbeatAtMs=now)
                q.run(conn, q.SET_RUNNING, {"run_id": run_id, "started": now, "hb": now, **o_params(owner)})
                return ACTIVATED

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
                if g is None or not token_is(g, claimant, token):
                    return CLAIM_LOST
                strategy = self._consensus
                if not matches(g, status, own, hb):
                    strategy.release(conn, run_id, claimant)
                    self._fact(conn, run_id, "released", claimant, token)
                    q.run(conn, q.CLEAR_CLAIM, {"run_id": run_id})
                    return SNAPSHOT_CHANGED
                now = self._now(method)
                if not isinstance(strategy.activate(conn, run_id, claimant, token, now), cs.Activated):
                    # The lease disowned this claim: the row drops it too, and says so.
                    q.run(conn, q.CLEAR_CLAIM, {"run_id": run_id})
                    self._fact(conn, run_id, "released", claimant, token, cause="activation-lost")
                    return CLAIM_LOST
                q.run(conn, q.SET_RUNNING, {"run_id": run_id, "started": now, "hb": now, **o_params(claimant)})
                self._fact(conn, run_id, "activated", claimant, token, heartbeatAtMs=now)
                return ACTIVATED

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
                p = {"run_id": run_id, "claimed_at": token, **c_params(claimant)}
                if q.run(conn, q.CLEAR_CLAIM_IF_TOKEN, p).fetchone() is None:
                    return CLAIM_LOST
                self._consensus.release(conn, run_id, claimant)
                self._fact(conn, run_id, "released", claimant, token)
                return ABANDONED

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
                op.done(LIVENESS_UNCONFIRMED)
                return LIVENESS_UNCONFIRMED

            def tx(conn: Connection) -> Any:
                g = q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone()
                if g is None:
                    return NOT_FOUND
                if not token_is(g, stale_claimant, token):
                    return CLAIM_CHANGED
                if token >= now - STALE_AFTER_MS:
                    return CLAIM_FRESH
                d = self._consensus.recover(conn, run_id, stale_claimant, token, observer, now, ev)
                if not isinstance(d, cs.Recovered):
                    return CLAIM_FRESH if getattr(d, "reason", None) == "claim_fresh" else CLAIM_CHANGED
                q.run(conn, q.CLEAR_CLAIM, {"run_id": run_id})
                self._fact(conn, run_id, "expired", stale_claimant, token, observer=observer,
                           cutoffMs=now - STALE_AFTER_MS, evidence=ev.kind)
                return RECOVERED

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
                op.done(LIVENESS_UNCONFIRMED)
                return LIVENESS_UNCONFIRMED
            assert hb is not None  # a running snapshot carries its heartbeat (check.snapshot)

            def tx(conn: Connection) -> Any:
                g = q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone()
                if g is None or not (matches(g, status, own, hb) and no_claim(g) and hb < now - STALE_AFTER_MS):
                    return classify(g, now)
                d = self._consensus.steal(conn, run_id, claimant, now, ev)
                if not isinstance(d, cs.Claimed):
                    return classify(g, now)
                q.run(conn, q.SET_CLAIM, {"run_id": run_id, "claimed_at": d.granted_at_ms, **c_params(claimant)})
                self._fact(conn, run_id, "stolen", claimant, d.granted_at_ms, holder=own, holderHeartbeatAtMs=g[4],
                           cutoffMs=now - STALE_AFTER_MS, evidence=ev.kind)
                return Claimed(d.granted_at_ms)

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    # ------------------------------------------------------------------ transitions
    def transition_owned(self, run_id: str, owner: OwnerId, to: str, state_json: str | None = None,
                         guard: dict[str, str] | None = None, *,
                         failure: RunFailure | None = None) -> TransitionOutcome:
        """Move a run ``owner`` holds to ``to`` (never ``pending``), optionally rewriting ``state_json``.

        ``running`` keeps the owner and rewrites only the state. ``suspended`` clears owner,
        heartbeat and claim; ``completed``/``failed``/``cancelled`` also stamp ``finished_at_ms``
        (store clock). ``cancel_requested_at_ms`` is never touched. ``guard`` is
        ``{"cancel_requested": "absent" | "present"}``, compiled into the same UPDATE as the fence.
        Outcomes: ``Transitioned``, ``NotFound``, ``FenceLost`` (the strategy or the row says another
        owner), ``GuardFailed`` (owned, guard refused). Leaving ``running`` releases the lease and
        records ``released``.

        ``failure`` (only with ``to="failed"``) records why the run failed in the same UPDATE: its
        three texts pass the journal's redaction, then are cut to ``RunFailure``'s limits.
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
            failure_json = check.failure(failure, method, to, self._store.journal._redactor())
            op.identity(runId=run_id, to=to, ownerHostId=owner.host_id)

            def tx(conn: Connection) -> Any:
                strategy = self._consensus
                if strategy.guard(conn, run_id, owner):
                    p = o_params(owner)
                    p.update(run_id=run_id, state_json=state_json, guard=g_code)
                    pending = None
                    if to == "running":
                        hit = q.run(conn, q.TRANSITION_RUNNING, p).fetchone()
                    else:
                        # Leaving drops any claim a stealer holds on the run: read it first, so
                        # that change of who claims the run leaves its own fact.
                        pending = q.run(conn, q.SELECT_GUARDED, {"run_id": run_id}).fetchone()
                        p["to"] = to
                        p["failure_json"] = failure_json
                        p["finished"] = self._now(method) if to in TERMINAL else None
                        hit = q.run(conn, q.TRANSITION_SETTLE, p).fetchone()
                    if hit is not None:
                        if to != "running":
                            strategy.release(conn, run_id, owner)
                            self._fact(conn, run_id, "released", owner, None)
                            claimant = None if pending is None or no_claim(pending) else OwnerId(
                                pending[5], pending[6], pending[7])
                            if pending is not None and claimant is not None and claimant != owner:
                                # (the owner's own claim is covered by its release, grant null)
                                self._fact(conn, run_id, "released", claimant, pending[8], cause="owner-left")
                            if to in TERMINAL:
                                self._db.after_commit(_count_throughput)
                        return TRANSITIONED
                    held = True
                else:
                    held = False
                row = q.run(conn, q.SELECT_FENCE_STATE, {"run_id": run_id}).fetchone()
                if row is None:
                    return NOT_FOUND
                if not held or row[0] != "running" or not owner_is(row, 1, owner):
                    return FENCE_LOST
                return GUARD_FAILED

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    # ------------------------------------------------------------------ stubs
    @staticmethod
    def noop(**overrides: Callable[..., Any]) -> NoopRunStore:
        """A store that persists nothing and says so (seed ``layerNoop``), with optional overrides.

        ``create``, ``create_many``, ``retry``, ``delete``, ``get``, ``lineage``, ``latest_round`` and
        ``request_cancel_lineage`` raise ``persistence_failed``; every compare-and-swap reports its
        loss (``NotFound``, or ``ClaimLost`` for ``activate`` and ``abandon_claim``);
        ``acknowledge_cancel`` is False.
        """
        return NoopRunStore(**overrides)


def _count_throughput() -> None:
    m.throughput.add(1)


def _json_ids(ids: list[str]) -> str:
    return msgspec.json.encode(ids).decode()


def _taken(conn: Connection, method: str, params: list[dict[str, Any]], single: bool) -> RunStoreError | None:
    """The first constraint the rows of ``params`` would break, as its ``constraint`` error, else None.

    A taken run id (``RunAlreadyExists``) first, then per row a ``parent_run_id`` that names no run
    and a ``(lineage_id, round_ordinal)`` already taken. The errors name fields, never values.
    """
    found = {r[0] for r in q.run(conn, q.EXISTING_IDS, {"ids": _json_ids([p["run_id"] for p in params])})}
    for i, p in enumerate(params):
        if p["run_id"] in found:
            return _already_exists(method, None if single else i)
    for i, p in enumerate(params):
        where = "" if single else f"runs[{i}]."
        if p["parent_run_id"] is not None and q.run(
                conn, q.RUN_EXISTS, {"run_id": p["parent_run_id"]}).fetchone() is None:
            return check.refuse(method, f"{where}parent_run_id names no run", {"field": f"{where}parent_run_id"},
                                code="constraint")
        if p["lineage_id"] is not None and q.run(conn, q.ROUND_EXISTS, {
                "lineage_id": p["lineage_id"], "round_ordinal": p["round_ordinal"]}).fetchone() is not None:
            return check.refuse(method, f"{where}lineage_id and round_ordinal: that round of the lineage already "
                                "exists", {"field": f"{where}lineage_id"}, code="constraint")
    return None


def _already_exists(method: str, index: int | None) -> RunStoreError:
    where = "" if index is None else f"runs[{index}]: "
    field = "run_id" if index is None else f"runs[{index}].run_id"
    return check.refuse(method, f"{where}a run with this id already exists", {"field": field},
                        code="constraint", cls=RunAlreadyExists)
