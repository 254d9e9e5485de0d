"""Ownership replay for auditors: rebuild who held a run from its ``flows.consensus.*`` facts alone.

The run store appends one fact per transition the consensus strategy grants (``claimed``,
``activated``, ``released``, ``stolen``, ``expired``) to the run's companion stream, in the same
transaction as the run-row mutation (REFERENCE 3.5). Replaying them in ``seq`` order rebuilds the
ownership intervals and checks the rules the strategy enforces:

* ``two_owners``: an owner is activated while another still holds the run and no steal displaced it;
* ``activated_without_claim``: an ``activated`` that does not consume a pending ``claimed``/``stolen``
  with the same owner and grant (this also covers an activation after a release with no new claim);
* ``claim_while_claimed`` / ``claim_while_owned``: a claim or steal the lease could not have granted;
* ``stolen_without_owner``, ``stolen_while_fresh``: a steal needs an owner whose lease was stale,
  i.e. granted more than ``STALE_AFTER`` before the steal's recorded time;
* ``expired_without_claim``, ``expired_while_fresh``: a recovery needs a pending claim that was stale
  at the fact's recorded time (allowing the permitted caller clock skew);
* ``released_without_hold``, ``malformed_fact``, ``wrong_run``, ``unknown_fact``.

Heartbeats are never journaled, so the staleness checks use what the facts prove: an owner was alive
at least at its grant. Violations are reported, never raised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from fencepost._values import identifier_problem, is_safe_int
from fencepost.errors import JournalError
from fencepost.journal.entries import Entry
from fencepost.journal.owner import OwnerId

if TYPE_CHECKING:
    from fencepost._store import Store

FACT_PREFIX = "flows.consensus."
#: The producer of every consensus fact; entries of other producers on the stream are not facts.
FACT_SOURCE = "flows.run-store"
#: A lease is stale once its heartbeat is strictly older than this many ms (seed leases.md).
STALE_AFTER_MS = 30_000
#: How far a caller's ``now_ms`` may run ahead of the store clock that stamps ``emitted_at_ms``.
SKEW_ALLOWANCE_MS = 10_000


class OwnershipInterval(msgspec.Struct, frozen=True):
    """One owner's tenure: from its ``activated`` fact to the fact that ended it (None: still open)."""

    owner: OwnerId
    granted_at_ms: int | None
    start_position: int
    start_seq: int
    started_at_ms: int
    end_position: int | None = None
    end_seq: int | None = None
    ended_at_ms: int | None = None
    ended_by: str | None = None


class Violation(msgspec.Struct, frozen=True):
    """A fact that breaks an ownership rule: where (``seq``, ``position``), which fact, which rule."""

    seq: int
    position: int
    event_type: str
    rule: str
    detail: str


class OwnershipHistory(msgspec.Struct, frozen=True):
    """The replayed history of one run: ``intervals`` in order, ``violations`` found, facts read."""

    run_id: str
    stream: str
    facts: int
    intervals: list[OwnershipInterval]
    violations: list[Violation]

    @property
    def ok(self) -> bool:
        """True when no fact broke a rule."""
        return not self.violations


class _Open(msgspec.Struct):
    owner: OwnerId
    grant: int | None
    position: int
    seq: int
    at_ms: int


class _Claim(msgspec.Struct):
    owner: OwnerId
    grant: int | None
    kind: str


def _owner_of(payload: Any) -> OwnerId | None:
    o = payload.get("owner") if type(payload) is dict else None
    if type(o) is not dict:
        return None
    host, pid, nonce = o.get("hostId"), o.get("pid"), o.get("nonce")
    if type(host) is not str or type(nonce) is not str or not is_safe_int(pid):
        return None
    return OwnerId(host, pid, nonce)


class _Replay:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.claim: _Claim | None = None
        self.current: _Open | None = None
        self.intervals: list[OwnershipInterval] = []
        self.violations: list[Violation] = []
        self.facts = 0

    def violate(self, e: Entry, rule: str, detail: str) -> None:
        self.violations.append(Violation(seq=e.seq, position=e.position, event_type=e.event_type, rule=rule,
                                         detail=detail))

    def close(self, e: Entry, ended_by: str) -> None:
        c = self.current
        assert c is not None
        self.intervals.append(OwnershipInterval(
            owner=c.owner, granted_at_ms=c.grant, start_position=c.position, start_seq=c.seq, started_at_ms=c.at_ms,
            end_position=e.position, end_seq=e.seq, ended_at_ms=e.emitted_at_ms, ended_by=ended_by,
        ))
        self.current = None

    def apply(self, e: Entry) -> None:
        kind = e.event_type[len(FACT_PREFIX):]
        self.facts += 1
        owner = _owner_of(e.payload)
        grant = e.payload.get("grantedAtMs") if type(e.payload) is dict else None
        if owner is None or not (grant is None or is_safe_int(grant)):
            self.violate(e, "malformed_fact", "payload lacks a well-formed owner or grantedAtMs")
            return
        if e.payload.get("runId") != self.run_id:
            self.violate(e, "wrong_run", "payload runId names another run")
        handler = getattr(self, f"_{kind}", None)
        if handler is None:
            self.violate(e, "unknown_fact", f"unknown consensus fact {kind!r}")
            return
        handler(e, owner, grant)

    def _claimed(self, e: Entry, owner: OwnerId, grant: int | None) -> None:
        if self.claim is not None:
            self.violate(e, "claim_while_claimed", "a claim was granted while another claim was pending")
        if self.current is not None:
            self.violate(e, "claim_while_owned", "a claim was granted while the run had an owner")
        self.claim = _Claim(owner, grant, "claimed")

    def _stolen(self, e: Entry, owner: OwnerId, grant: int | None) -> None:
        if self.claim is not None:
            self.violate(e, "claim_while_claimed", "a steal was granted while a claim was pending")
        if self.current is None:
            self.violate(e, "stolen_without_owner", "a steal was granted while nobody owned the run")
        elif grant is None or self.current.grant is None or not self.current.grant < grant - STALE_AFTER_MS:
            self.violate(e, "stolen_while_fresh",
                         f"the owner's lease was granted within {STALE_AFTER_MS} ms of the steal")
        self.claim = _Claim(owner, grant, "stolen")

    def _activated(self, e: Entry, owner: OwnerId, grant: int | None) -> None:
        claim = self.claim
        matched = claim is not None and claim.owner == owner and claim.grant == grant
        if not matched:
            self.violate(e, "activated_without_claim", "no pending claim or steal with this owner and grant")
        current = self.current
        if current is not None:
            if matched and claim is not None and claim.kind == "stolen":
                self.close(e, "stolen")
            elif current.owner == owner and not matched:
                return  # the same owner activated again: keep its interval
            else:
                self.violate(e, "two_owners", "activated while another owner held the run")
                self.close(e, "displaced")
        if matched:
            self.claim = None
        self.current = _Open(owner, grant, e.position, e.seq, e.emitted_at_ms)

    def _released(self, e: Entry, owner: OwnerId, grant: int | None) -> None:
        matched = False
        if self.claim is not None and self.claim.owner == owner and (grant is None or grant == self.claim.grant):
            self.claim = None
            matched = True
        if self.current is not None and self.current.owner == owner and (grant is None or grant == self.current.grant):
            self.close(e, "released")
            matched = True
        if not matched:
            self.violate(e, "released_without_hold", "released by an owner that held neither the claim nor the run")

    def _expired(self, e: Entry, owner: OwnerId, grant: int | None) -> None:
        claim = self.claim
        if claim is None or claim.owner != owner or claim.grant != grant:
            self.violate(e, "expired_without_claim", "no pending claim with this owner and grant")
            return
        if grant is None or not grant < e.emitted_at_ms + SKEW_ALLOWANCE_MS - STALE_AFTER_MS:
            self.violate(e, "expired_while_fresh", f"the claim was not older than {STALE_AFTER_MS} ms when it expired")
        self.claim = None

    def result(self, stream: str) -> OwnershipHistory:
        intervals = list(self.intervals)
        if self.current is not None:
            c = self.current
            intervals.append(OwnershipInterval(owner=c.owner, granted_at_ms=c.grant, start_position=c.position,
                                               start_seq=c.seq, started_at_ms=c.at_ms))
        return OwnershipHistory(run_id=self.run_id, stream=stream, facts=self.facts, intervals=intervals,
                                violations=self.violations)


def ownership_history(store: Store, run_id: str) -> OwnershipHistory:
    """Rebuild and check the ownership history of ``run_id`` from its consensus facts alone.

    Reads the run's ``run-store`` companion stream in ``seq`` order; entries that are not
    ``flows.consensus.*`` facts of the ``flows.run-store`` producer are skipped. Rule breaks are
    returned in ``violations``.
    """
    from fencepost.journal import companion_stream

    problem = identifier_problem(run_id)
    if problem:
        raise JournalError("invalid_event", "ownership_history", f"run_id {problem}")
    stream = companion_stream(run_id)
    replay = _Replay(run_id)
    after = -1
    while True:
        page = store.journal.entries(stream, after=after, limit=10_000)
        for e in page.entries:
            if e.event_type.startswith(FACT_PREFIX) and e.source_id == FACT_SOURCE:
                replay.apply(e)
        if not page.has_more:
            break
        after = page.entries[-1].seq
    return replay.result(stream)
