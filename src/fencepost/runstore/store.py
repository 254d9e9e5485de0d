"""``store.runs``: the run-ownership contract, arbitrated by the consensus strategy (line A).

Every operation validates all of its inputs first (``invalid_run``, nothing written), then runs in
ONE serialized write transaction: it reads the run row under the writer lock, checks the seeds'
predicate (REFERENCE 2.2), asks the strategy (REFERENCE 3.4), mirrors the decision onto the row
and appends the granted transition as a ``flows.consensus.*`` fact on the run's companion stream.
Row, lease and fact commit together or not at all. Contention is returned as an outcome
(``fencepost.runstore.outcomes``); only defects raise ``RunStoreError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

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


class RunStore(Leases, Cancellation):
    """Runs, their ownership and their cancellation; see the module docstring for the contract."""

    MAXIMUM_RUN_JSON_DEPTH = MAXIMUM_RUN_JSON_DEPTH
    MAXIMUM_RUN_JSON_NODES = MAXIMUM_RUN_JSON_NODES

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
                now = self._clock.now_ms()
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
                        p["finished"] = self._clock.now_ms() if to in TERMINAL else None
                        hit = q.run(conn, q.TRANSITION_SETTLE, p).fetchone()
                    if hit is not None:
                        if to != "running":
                            strategy.release(conn, run_id, owner)
                            self._fact(conn, run_id, "released", owner, None)
                            claimant = None if pending is None or no_claim(pending) else OwnerId(
                                pending[5], pending[6], pending[7])
                            if claimant is not None and claimant != owner:
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

        ``create``, ``get``, ``lineage``, ``latest_round`` and ``request_cancel_lineage`` raise
        ``persistence_failed``; every compare-and-swap reports its loss (``NotFound``, or
        ``ClaimLost`` for ``activate`` and ``abandon_claim``); ``acknowledge_cancel`` is False.
        """
        return NoopRunStore(**overrides)


def _count_throughput() -> None:
    m.throughput.add(1)
