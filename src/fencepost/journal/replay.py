"""Ownership replay for auditors: rebuild who held a run from its ``flows.consensus.*`` facts alone.

The run store appends one fact per transition that changes who holds or claims a run (``claimed``,
``activated``, ``released``, ``stolen``, ``expired``) to the run's companion stream, in the same
transaction as the run-row mutation (REFERENCE 3.5). Each fact carries the evidence the store
decided on: ``activated`` the heartbeat it stamped (``heartbeatAtMs``); ``stolen`` the displaced
``holder``, the holder's heartbeat the store read (``holderHeartbeatAtMs``), the staleness
``cutoffMs`` it compared that reading with and the ``evidence`` kind; ``expired`` the ``cutoffMs``
and ``evidence`` kind. Replaying the facts in ``seq`` order rebuilds the ownership intervals
(``ownership_step``, shared with the ``OwnershipHistory`` projection) and checks the rules:

* ``two_owners``: an owner is activated while another still holds the run and no steal displaced it;
* ``activated_without_claim``: an ``activated`` that does not consume a pending ``claimed``/``stolen``
  with the same owner and grant (this also covers an activation after a release with no new claim);
* ``claim_while_claimed`` / ``claim_while_owned``: a claim or steal the lease could not have granted;
* ``stolen_without_owner``; ``stolen_wrong_holder`` (the steal names another holder than the run's
  owner); ``stolen_while_fresh``: the recorded reading was not older than the recorded cutoff, the
  cutoff is not the steal's own reading minus ``STALE_AFTER``, the reading is older than a heartbeat
  earlier facts prove, or the steal's reading is further ahead of the store clock than the skew
  allowance; ``evidence_invalid``: the evidence kind's host rule does not hold;
* ``expired_without_claim``, ``expired_while_fresh``: a recovery needs a pending claim that was older
  than the recorded cutoff (and a cutoff within the skew allowance of the store clock);
* ``released_without_hold``, ``malformed_fact`` (also a stored fact the journal cannot decode), ``wrong_run``,
  ``unknown_fact``.
* ``chain_broken``: the companion stream's own hash chain breaks at this entry (edited or removed by
  hand; ``verify.rows_breaks``; a value stored past the table's types, such as text that is not
  UTF-8 or a ``seq`` that is not an integer, is named by its column and the fact not judged), or
  the journal's next entry does not follow the stream's last (its newest facts removed). Facts
  rewritten with fresh hashes, or removed while they were the journal's newest entries, need
  ``verify`` with an anchor.

Facts written before the evidence fields existed still replay: without ``heartbeatAtMs`` an
activation proves the owner's heartbeat only down to its grant minus the skew allowance, and a
steal without a recorded reading is judged against that bound. Violations are reported, never raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from sqlalchemy import LargeBinary, Text, bindparam, cast, func, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from fencepost._durable import DbFailure, carry_failure, failure_code, failure_detail
from fencepost._schema import flows_journal_events as _events
from fencepost._schema import flows_runs as _runs
from fencepost._values import identifier_problem, is_safe_int
from fencepost.errors import JournalError
from fencepost.journal.entries import Entry, entry_from_row
from fencepost.journal.owner import OwnerId
from fencepost.journal.verify import Break, Undecodable, checked_store, rows_breaks, stream_rows

if TYPE_CHECKING:
    from fencepost._store import Store

FACT_PREFIX = "flows.consensus."
#: The producer of every consensus fact; entries of other producers on the stream are not facts.
FACT_SOURCE = "flows.run-store"
#: A lease is stale once its heartbeat is strictly older than this many ms (seed leases.md).
STALE_AFTER_MS = 30_000
#: How far a caller's ``now_ms`` may run ahead of the store clock that stamps ``emitted_at_ms``.
SKEW_ALLOWANCE_MS = 10_000
#: The kinds of fact the run store writes.
FACT_KINDS = ("claimed", "activated", "released", "stolen", "expired")
_COMPANION = "flows.companion/run-store/"


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
    """A fact that breaks an ownership rule: where (``seq``, ``position``), which fact, which rule.

    ``seq`` is -1 when the stored seq is not an integer; ``seq`` and ``position`` are both -1 when
    no fact is left to point at (a run whose row was claimed or started, its facts all removed)."""

    seq: int
    position: int
    event_type: str
    rule: str
    detail: str

    @property
    def where(self) -> str:
        """Where it is, for people: "at seq 3", "at position 12" (seq unknown), or "with no facts"."""
        if self.seq >= 0:
            return f"at seq {self.seq}"
        return f"at position {self.position}" if self.position >= 0 else "with no facts"


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


class Holding(msgspec.Struct, frozen=True):
    """A claim pending on a run, or the run's current owner: who, under which grant, taken how.

    ``kind`` is ``claimed`` or ``stolen`` for a claim, ``activated`` for an owner.
    """

    owner: OwnerId
    granted_at_ms: int | None
    kind: str


class Step(msgspec.Struct, frozen=True):
    """What one fact does to a run's ownership (``ownership_step``).

    ``claim_ended`` says how the pending claim ended (``superseded``, ``released``, ``expired``),
    ``interval_ended`` how the open interval ended (``stolen``, ``released``, ``displaced``),
    ``activated_claim`` that the pending claim became the owner (its interval opens at this fact),
    ``interval_opened`` that an interval opens at this fact (from the claim or without one),
    ``claim`` the claim pending after the fact, and ``rules`` the structural rules the fact broke.
    """

    claim: Holding | None
    claim_ended: str | None = None
    interval_ended: str | None = None
    activated_claim: bool = False
    interval_opened: bool = False
    rules: tuple[str, ...] = ()


def ownership_step(owner_now: Holding | None, claim: Holding | None, kind: str, owner: OwnerId,
                   granted_at_ms: int | None) -> Step:
    """Apply one consensus fact to a run's ownership: the one interval-building rule.

    ``owner_now`` is the run's open interval (None: nobody owns it), ``claim`` the pending claim;
    ``kind``, ``owner`` and ``granted_at_ms`` are the fact's. Replay and the ``OwnershipHistory``
    projection both build their intervals with this function, so they cannot disagree:

    * ``claimed`` / ``stolen`` record a pending claim (a steal changes no owner until activated);
    * ``activated`` opens an interval; when it consumes a pending steal it ends the displaced owner's
      interval (``stolen``); the same owner activated again without a claim keeps its interval;
    * ``released`` ends the releaser's claim and/or the releaser's interval, nobody else's;
    * ``expired`` ends the matching pending claim.
    """
    rules: list[str] = []
    if kind in ("claimed", "stolen"):
        if claim is not None:
            rules.append("claim_while_claimed")
        if kind == "claimed" and owner_now is not None:
            rules.append("claim_while_owned")
        if kind == "stolen" and owner_now is None:
            rules.append("stolen_without_owner")
        return Step(claim=Holding(owner, granted_at_ms, kind), claim_ended="superseded" if claim else None,
                    rules=tuple(rules))
    if kind == "activated":
        matched = claim is not None and claim.owner == owner and claim.granted_at_ms == granted_at_ms
        if not matched:
            rules.append("activated_without_claim")
        ended = None
        if owner_now is not None:
            if matched and claim is not None and claim.kind == "stolen":
                ended = "stolen"
            elif owner_now.owner == owner and not matched:
                return Step(claim=claim, rules=tuple(rules))  # the same owner again: keep its interval
            else:
                rules.append("two_owners")
                ended = "displaced"
        return Step(claim=None if matched else claim, interval_ended=ended, activated_claim=matched,
                    interval_opened=True, rules=tuple(rules))
    if kind == "released":
        claim_ended = interval_ended = None
        if claim is not None and claim.owner == owner and granted_at_ms in (None, claim.granted_at_ms):
            claim_ended = "released"
        if owner_now is not None and owner_now.owner == owner and granted_at_ms in (None, owner_now.granted_at_ms):
            interval_ended = "released"
        if claim_ended is None and interval_ended is None:
            rules.append("released_without_hold")
        return Step(claim=None if claim_ended else claim, claim_ended=claim_ended, interval_ended=interval_ended,
                    rules=tuple(rules))
    if kind == "expired":
        if claim is None or claim.owner != owner or claim.granted_at_ms != granted_at_ms:
            return Step(claim=claim, rules=("expired_without_claim",))
        return Step(claim=None, claim_ended="expired")
    return Step(claim=claim, rules=("unknown_fact",))


class _Open(msgspec.Struct):
    owner: OwnerId
    grant: int | None
    position: int
    seq: int
    at_ms: int
    #: The newest heartbeat the facts prove this owner had (None: nothing proven).
    floor: int | None


def owner_of(value: Any) -> OwnerId | None:
    """The ``{hostId, pid, nonce}`` member ``value`` as an ``OwnerId``, or None when malformed."""
    if type(value) is not dict:
        return None
    host, pid, nonce = value.get("hostId"), value.get("pid"), value.get("nonce")
    if type(host) is not str or type(nonce) is not str or not is_safe_int(pid):
        return None
    return OwnerId(host, pid, nonce)


_EVIDENCE_FIELDS = {
    "activated": ("heartbeatAtMs",),
    "stolen": ("holder", "holderHeartbeatAtMs", "cutoffMs", "evidence"),
    "expired": ("cutoffMs", "evidence"),
}
_EVIDENCE_KINDS = ("lease-expired", "same-host-pid-dead", "cross-host-unreachable-stale")


def fact_problem(kind: str, payload: Any) -> str | None:
    """Why replay reports a fact of ``kind`` with this payload as ``malformed_fact`` and applies
    nothing (None: well-formed). The ``OwnershipHistory`` projection skips the same facts."""
    if type(payload) is not dict:
        payload = {}
    grant = payload.get("grantedAtMs")
    if owner_of(payload.get("owner")) is None or not (grant is None or is_safe_int(grant)):
        return "payload lacks a well-formed owner or grantedAtMs"
    for name in _EVIDENCE_FIELDS.get(kind, ()):
        if name not in payload:
            continue
        v = payload[name]
        if name == "holder":
            ok = owner_of(v) is not None
        elif name == "evidence":
            ok = type(v) is str
        else:
            ok = is_safe_int(v)
        if not ok:
            return f"payload {name} is malformed"
    return None


class _Replay:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.claim: Holding | None = None
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
        payload = e.payload if type(e.payload) is dict else {}
        problem = fact_problem(kind, payload)
        if problem is not None:
            self.violate(e, "malformed_fact", problem)
            return
        owner = owner_of(payload.get("owner"))
        assert owner is not None  # fact_problem checked it
        grant = payload.get("grantedAtMs")
        if payload.get("runId") != self.run_id:
            # A fact about another run does not change this run's history.
            self.violate(e, "wrong_run", "payload runId names another run")
            return
        if kind == "stolen":
            self._judge_steal(e, payload, owner, grant)
        elif kind == "expired":
            self._judge_expiry(e, payload, owner, grant)
        current = self.current
        held = None if current is None else Holding(current.owner, current.grant, "activated")
        step = ownership_step(held, self.claim, kind, owner, grant)
        for rule in step.rules:
            self.violate(e, rule, _DETAILS[rule])
        if step.interval_ended is not None:
            self.close(e, step.interval_ended)
        self.claim = step.claim
        if step.interval_opened:
            hb = payload.get("heartbeatAtMs")
            floor = hb if hb is not None else (None if grant is None else grant - SKEW_ALLOWANCE_MS)
            self.current = _Open(owner, grant, e.position, e.seq, e.emitted_at_ms, floor)

    def _judge_steal(self, e: Entry, payload: dict[str, Any], thief: OwnerId, grant: int | None) -> None:
        current = self.current
        if current is None:
            return  # stolen_without_owner, from ownership_step
        holder = current.owner
        if "holder" in payload:
            named = owner_of(payload["holder"])
            assert named is not None  # fact_problem checked it
            holder = named
        if holder != current.owner:
            self.violate(e, "stolen_wrong_holder", "the steal displaces an owner that did not hold the run")
        kind = payload.get("evidence")
        if kind is not None and not _host_rule(kind, holder, thief):
            self.violate(e, "evidence_invalid", "the evidence kind does not admit a steal between these hosts")
        reading = payload.get("holderHeartbeatAtMs")
        cutoff = payload.get("cutoffMs")
        floor = current.floor
        fresh: str | None
        if grant is None:
            fresh = "the steal has no reading"
        elif grant > e.emitted_at_ms + SKEW_ALLOWANCE_MS:
            fresh = "the steal's reading is further ahead of the store clock than the skew allowance"
        elif reading is None or cutoff is None:
            # A fact from before the evidence fields: judge against what earlier facts prove.
            fresh = None if floor is None or floor < grant - STALE_AFTER_MS else (
                f"the owner's lease was renewed within {STALE_AFTER_MS} ms of the steal")
        elif cutoff != grant - STALE_AFTER_MS:
            fresh = "the recorded cutoff is not the steal's reading minus the staleness window"
        elif not reading < cutoff:
            fresh = "the holder's recorded heartbeat was not older than the cutoff"
        elif floor is not None and reading < floor:
            fresh = "the recorded heartbeat is older than one the owner's earlier facts prove"
        else:
            fresh = None
            current.floor = reading if floor is None else max(floor, reading)
        if fresh is not None:
            self.violate(e, "stolen_while_fresh", fresh)

    def _judge_expiry(self, e: Entry, payload: dict[str, Any], owner: OwnerId, grant: int | None) -> None:
        claim = self.claim
        if claim is None or claim.owner != owner or claim.granted_at_ms != grant:
            return  # expired_without_claim, from ownership_step
        cutoff = payload.get("cutoffMs")
        limit = e.emitted_at_ms + SKEW_ALLOWANCE_MS - STALE_AFTER_MS
        if grant is None or not grant < (limit if cutoff is None else min(cutoff, limit)):
            self.violate(e, "expired_while_fresh", f"the claim was not older than {STALE_AFTER_MS} ms when it expired")

    def result(self, stream: str) -> OwnershipHistory:
        intervals = list(self.intervals)
        if self.current is not None:
            c = self.current
            intervals.append(OwnershipInterval(owner=c.owner, granted_at_ms=c.grant, start_position=c.position,
                                               start_seq=c.seq, started_at_ms=c.at_ms))
        return OwnershipHistory(run_id=self.run_id, stream=stream, facts=self.facts, intervals=intervals,
                                violations=self.violations)


def _host_rule(kind: Any, holder: OwnerId, actor: OwnerId) -> bool:
    if kind == "same-host-pid-dead":
        return actor.host_id == holder.host_id
    if kind == "cross-host-unreachable-stale":
        return actor.host_id != holder.host_id
    return kind == "lease-expired"


_DETAILS = {
    "claim_while_claimed": "a claim was granted while another claim was pending",
    "claim_while_owned": "a claim was granted while the run had an owner",
    "stolen_without_owner": "a steal was granted while nobody owned the run",
    "activated_without_claim": "no pending claim or steal with this owner and grant",
    "two_owners": "activated while another owner held the run",
    "released_without_hold": "released by an owner that held neither the claim nor the run",
    "expired_without_claim": "no pending claim with this owner and grant",
    "unknown_fact": "unknown consensus fact",
}


class _Stream(msgspec.Struct, frozen=True):
    """One companion stream as one read found it: its stored rows in append order (an entry
    holding values not of the journal's types as ``verify``'s ``Undecodable``), its chain's breaks,
    the run it belongs to (None: its facts name none) and, read in the same snapshot, who that
    run's row says owns and claims it (``_RunHolders``; None: no such row)."""

    name: str
    rows: list[Any]
    breaks: list[Break]
    run_id: str | None = None
    holders: Any = None


# Who the run row says holds the run: its owner, and its pending claim with the claim's grant;
# and whether it was ever started (only an owner's activation, a fact, starts a run).
_RUN_HOLDERS = select(
    _runs.c.owner_host_id, _runs.c.owner_pid, _runs.c.owner_nonce,
    _runs.c.claim_host_id, _runs.c.claim_pid, _runs.c.claim_nonce, _runs.c.claimed_at_ms,
    _runs.c.started_at_ms,
).where(_runs.c.run_id == bindparam("run_id"))


def _read_stream(store: Store, stream: str, method: str, run_id: str | None = None) -> _Stream:
    """Read ``stream`` once: the same rows serve to name its run (unless ``run_id`` is given), judge
    its facts and check its chain, in one read snapshot with the run row's holders (three
    statements: the rows, the log entry after the last, the run row)."""
    from fencepost.journal import companion_stream

    def run(conn: Connection) -> _Stream:
        rows = stream_rows(store, conn, stream)
        named = run_id if run_id is not None else _run_named_by(rows, companion_stream, stream)
        holders = None if named is None else conn.execute(_RUN_HOLDERS, {"run_id": named}).first()
        return _Stream(stream, rows, rows_breaks(conn, rows), named, holders)

    try:
        return store.db.read(run)
    except DbFailure as exc:
        raise carry_failure(JournalError(failure_code(exc, "read_failed", closed="journal_closed"), method,
                                         failure_detail("journal read", exc)),
                            exc) from None


def _facts(rows: list[Any]) -> Iterator[Entry | Violation]:
    """A stream's consensus facts, decoded; a fact the journal's decoder refuses comes back as
    its ``malformed_fact`` violation (naming the field and position, never the value). An entry
    whose text is not UTF-8, or whose integer column holds something else, is skipped: its
    ``encoding`` or ``integer`` break reports it."""
    for row in rows:
        if (type(row) is Undecodable or not row.event_type.startswith(FACT_PREFIX)
                or row.source_id != FACT_SOURCE):
            continue
        try:
            yield entry_from_row(row, "ownership_history")
        except JournalError as exc:
            event_type = row.event_type if identifier_problem(row.event_type) is None else ""
            yield Violation(seq=int(row.seq), position=int(row.position), event_type=event_type,
                            rule="malformed_fact", detail=exc.detail)


def ownership_history(store: Store, run_id: str) -> OwnershipHistory:
    """Rebuild and check the ownership history of ``run_id`` from its consensus facts alone.

    Reads the run's ``run-store`` companion stream in ``seq`` order, once; entries that are not
    ``flows.consensus.*`` facts of the ``flows.run-store`` producer are skipped. Rule breaks are
    returned in ``violations``; an entry edited or removed by hand, or holding stored text that is
    not UTF-8 or an integer column that holds something else, is ``chain_broken`` at its seq (-1
    when the seq itself is not an integer) naming the column (the latter two are not judged), and
    a fact the journal cannot decode is ``malformed_fact`` (not applied).
    """
    from fencepost.journal import companion_stream

    checked_store(store, "ownership_history")
    problem = identifier_problem(run_id)
    if problem:
        raise JournalError("invalid_event", "ownership_history", f"run_id {problem}")
    return _history(run_id, _read_stream(store, companion_stream(run_id), "ownership_history", run_id))


def _history(run_id: str, stream: _Stream) -> OwnershipHistory:
    replay = _Replay(run_id)
    types: dict[int, str] = {}
    last: Entry | None = None
    for e in _facts(stream.rows):
        if type(e) is Violation:
            replay.facts += 1
            replay.violations.append(e)
            continue
        assert type(e) is Entry
        types[e.seq] = e.event_type
        replay.apply(e)
        last = e
    history = replay.result(stream.name)
    # The facts are judged as stored; a fact edited or removed by hand must not pass as history.
    chain: dict[int, list[Any]] = {}
    for b in stream.breaks:
        chain.setdefault(b.seq, []).append(b)
    found = [Violation(seq=seq, position=bs[0].position, event_type=types.get(seq, ""), rule="chain_broken",
                       detail="the stream's hash chain breaks here (" + "; ".join(
                           f"{b.what}: {b.detail}" for b in bs) + "): run journal verify")
             for seq, bs in chain.items()]
    row: list[Violation] = []
    if replay.facts == 0 and stream.holders is not None and _held(stream.holders):
        row.append(Violation(seq=-1, position=-1, event_type="", rule="row_disagrees",
                             detail="the run row was claimed or started, but its stream holds no ownership facts: "
                                    "they were removed, or the row was edited by hand (run journal verify)"))
    elif last is not None and stream.holders is not None:
        disagreement = _row_disagrees(replay, stream.holders)
        if disagreement is not None:
            row.append(Violation(seq=last.seq, position=last.position, event_type=last.event_type,
                                 rule="row_disagrees", detail=disagreement))
    if not found and not row:
        return history
    # By seq; at one seq, a broken chain first (it explains the rest), the row's disagreement last.
    violations = sorted([*found, *history.violations, *row], key=lambda v: v.seq)
    return msgspec.structs.replace(history, violations=violations)


def _held(holders: Any) -> bool:
    """Whether the run row was claimed or started: each of those wrote a fact with it."""
    return (holders.started_at_ms is not None or holders.owner_host_id is not None
            or holders.claim_host_id is not None)


def _row_disagrees(replay: _Replay, holders: Any) -> str | None:
    """Why the run row's owner or pending claim is not the one the facts end with, or None.

    Every change of who owns or claims a run writes its fact in the same transaction as the row,
    so the two always agree; they disagree when facts were removed (a stream's newest facts leave
    the rest of its chain intact) or the row or a fact was edited by hand."""
    h = holders
    row_owner = None if h.owner_host_id is None else OwnerId(h.owner_host_id, h.owner_pid, h.owner_nonce)
    row_claim = (None if h.claim_host_id is None
                 else (OwnerId(h.claim_host_id, h.claim_pid, h.claim_nonce), h.claimed_at_ms))
    fact_owner = None if replay.current is None else replay.current.owner
    fact_claim = None if replay.claim is None else (replay.claim.owner, replay.claim.granted_at_ms)
    problems = []
    if row_owner != fact_owner:
        problems.append("the run row's owner is not the one its last facts leave holding it"
                        if fact_owner is not None and row_owner is not None
                        else "the run row has an owner its facts do not give it" if fact_owner is None
                        else "the facts leave an owner holding the run, its row has none")
    if row_claim != fact_claim:
        problems.append("the run row's pending claim is not the one its facts leave pending")
    if not problems:
        return None
    return ("; ".join(problems) + ": facts after these were removed, or the row or a fact was edited "
            "by hand (run journal verify)")


class ReplaySummary(msgspec.Struct, frozen=True):
    """``replay_all``: every run's history, and the totals an auditor reads first.

    ``runs`` counts the runs replayed, ``intervals`` their ownership intervals, ``violations`` maps
    each broken rule to how often it was broken; ``unattributed_streams`` lists companion streams
    whose facts name no run that hashes to them (facts nobody can attribute). ``ok`` is True when
    nothing was broken. ``histories`` holds every run's history, by run id, so its size grows with
    the store; ``replay_each`` replays in memory that does not.
    """

    runs: int
    intervals: int
    violations: dict[str, int]
    unattributed_streams: list[str]
    histories: list[OwnershipHistory]

    @property
    def ok(self) -> bool:
        """True when no run broke a rule and every fact stream names its run."""
        return not self.violations and not self.unattributed_streams


class ReplayTotals(msgspec.Struct, frozen=True):
    """``replay_each``: the totals of ``ReplaySummary``, and only the histories that break a rule.

    ``runs``, ``intervals``, ``violations`` and ``unattributed_streams`` are as in
    ``ReplaySummary``; ``broken`` holds the history of each run that broke a rule, by run id (the
    others were handed to the callback and not kept).
    """

    runs: int
    intervals: int
    violations: dict[str, int]
    unattributed_streams: list[str]
    broken: list[OwnershipHistory]

    @property
    def ok(self) -> bool:
        """True when no run broke a rule and every fact stream names its run."""
        return not self.violations and not self.unattributed_streams


def _run_named_by(rows: list[Any], companion_stream: Callable[[str], str], stream: str) -> str | None:
    """The run a companion stream belongs to: the first ``runId`` its facts name that hashes to it."""
    for e in _facts(rows):
        if type(e) is not Entry:
            continue
        named = e.payload.get("runId") if type(e.payload) is dict else None
        if type(named) is str and named and companion_stream(named) == stream:
            return named
    return None


#: How many companion streams one listing statement returns: the streams are listed a page at a
#: time, so a replay holds one page of their names, not every stream's.
_STREAM_PAGE = 1000
_FACT_FILTER = (_events.c.source_id == FACT_SOURCE, _events.c.event_type.like(FACT_PREFIX + "%"),
                _events.c.run_id.like(_COMPANION + "%"))
# The next page of companion streams after the last one listed (keyset on the indexed ``run_id``).
_FACT_STREAMS = (
    select(_events.c.run_id).distinct()
    .where(*_FACT_FILTER, _events.c.run_id > bindparam("after"))
    .order_by(_events.c.run_id)
    .limit(bindparam("page"))
)
# The same page with the names read as their stored bytes (SQLite, where a name can hold a byte
# that is not UTF-8 and fail the whole page): ``after`` is bytes too, compared as the stored text.
_FACT_STREAMS_RAW = (
    select(cast(_events.c.run_id, LargeBinary)).distinct()
    .where(*_FACT_FILTER, _events.c.run_id > cast(bindparam("after", type_=LargeBinary), Text))
    .order_by(_events.c.run_id)
    .limit(bindparam("page"))
)
# How many companion streams there are (for progress, when they fill more than one page).
_FACT_STREAM_COUNT = select(func.count()).select_from(select(_events.c.run_id).distinct().where(*_FACT_FILTER)
                                                      .subquery())
# The rows that were claimed or started, so must have facts (a page, keyset on the primary key).
_HELD = or_(_runs.c.started_at_ms.is_not(None), _runs.c.owner_host_id.is_not(None),
            _runs.c.claim_host_id.is_not(None))
_HELD_RUNS = (select(_runs.c.run_id).where(_HELD, _runs.c.run_id > bindparam("after"))
              .order_by(_runs.c.run_id).limit(bindparam("page")))
_HELD_RUNS_RAW = (select(cast(_runs.c.run_id, LargeBinary))
                  .where(_HELD, _runs.c.run_id > cast(bindparam("after", type_=LargeBinary), Text))
                  .order_by(_runs.c.run_id).limit(bindparam("page")))
# Which of the given companion streams hold facts.
_WITH_FACTS = (select(_events.c.run_id).distinct()
               .where(*_FACT_FILTER, _events.c.run_id.in_(bindparam("streams", expanding=True))))


def _listed(store: Store, statement: Any, params: dict[str, Any]) -> Any:
    def run(conn: Connection) -> Any:
        return conn.execute(statement, params).scalars().all()

    return _listing_read(store, run)


T = TypeVar("T")


def _listing_read(store: Store, run: Callable[[Connection], T]) -> T:
    """``run`` in one read; a database failure is ``replay_all``'s ``JournalError``."""
    try:
        return store.db.read(run)
    except DbFailure as exc:
        raise carry_failure(JournalError(failure_code(exc, "read_failed", closed="journal_closed"), "replay_all",
                                         failure_detail("journal read", exc)),
                            exc) from None


def _names(conn: Connection, store: Store, statements: tuple[Any, Any], after: str | bytes,
           page: int) -> list[str | bytes]:
    """The next page of names after ``after`` that ``statements`` (as text, as stored bytes) list:
    each a ``str``, or, for a name stored as something that is not UTF-8 text (SQLite: a byte that
    is not UTF-8, a BLOB), its stored bytes. Such a name fails the whole page when read as text,
    so that page is read again as bytes: one damaged name does not stop the replay of the others."""
    as_text, as_bytes = statements
    if type(after) is str:
        try:
            return list(conn.execute(as_text, {"after": after, "page": page}).scalars().all())
        except DBAPIError as exc:
            if store.db.backend.classify(exc)[0] != "decode_failed":
                raise
    mark = after.encode("utf-8") if type(after) is str else after
    names: list[str | bytes] = []
    for raw in conn.execute(as_bytes, {"after": mark, "page": page}).scalars():
        raw = bytes(raw)
        try:
            names.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            names.append(raw)
    return names


def _stream_names(store: Store, after: str | bytes, page: int) -> list[str | bytes]:
    """The next page of companion stream names after ``after`` (see ``_names``)."""
    return _listing_read(store, lambda conn: _names(conn, store, (_FACT_STREAMS, _FACT_STREAMS_RAW), after, page))


def _held_without_facts(store: Store, after: str | bytes, page: int) -> tuple[list[str | bytes], list[str]]:
    """The next page of runs whose row was claimed or started (see ``_names``), and those of them
    whose companion stream holds no fact, in one read: their facts were removed. A run id that is
    not text (tampered, SQLite) is left to ``journal verify``: no stream can be named for it."""
    from fencepost.journal import companion_stream

    def run(conn: Connection) -> tuple[list[str | bytes], list[str]]:
        held = _names(conn, store, (_HELD_RUNS, _HELD_RUNS_RAW), after, page)
        streams = {companion_stream(r): r for r in held if type(r) is str}
        if not streams:
            return held, []
        found = set(conn.execute(_WITH_FACTS, {"streams": list(streams)}).scalars())
        return held, [run_id for stream, run_id in streams.items() if stream not in found]

    return _listing_read(store, run)


def _checked_progress(method: str, on_progress: Any) -> None:
    if on_progress is not None and not callable(on_progress):
        raise JournalError("invalid_event", method, "on_progress must be callable (or None)")


def replay_each(store: Store, on_history: Callable[[OwnershipHistory], None] | None = None, *,
                on_progress: Callable[[int, int], None] | None = None) -> ReplayTotals:
    """Replay every run that has ownership facts, or whose row says it should (claimed or started:
    its facts all removed), handing each history to ``on_history`` as soon as it is replayed;
    return the totals and the histories that break a rule.

    What ``replay_all`` does, in memory that does not grow with the number of runs: the companion
    streams are listed a page at a time and replayed in that order (the order of their names, the
    sha256 of the run id, not the order of the run ids), each history is handed over and then
    dropped unless it breaks a rule; then the runs whose facts are all gone, in run id order.
    ``on_progress`` is as for ``replay_all``; when streams are added while the replay runs, or runs
    without facts are found, ``total`` grows to count them. An exception either callback raises
    ends the replay and propagates.
    """
    checked_store(store, "replay_all")
    _checked_progress("replay_all", on_progress)
    if on_history is not None and not callable(on_history):
        raise JournalError("invalid_event", "replay_all", "on_history must be callable (or None)")
    page_size = _STREAM_PAGE
    page = _stream_names(store, "", page_size)
    total = len(page)
    if on_progress is not None:
        if len(page) == page_size:  # more pages follow: count them all, once
            total = max(total, int(_listed(store, _FACT_STREAM_COUNT, {})[0]))
        on_progress(0, total)
    from fencepost.journal import companion_stream

    runs = intervals = done = 0
    broken: list[OwnershipHistory] = []
    orphans: list[str] = []
    counts: dict[str, int] = {}

    def tally(h: OwnershipHistory) -> None:
        nonlocal runs, intervals
        runs += 1
        intervals += len(h.intervals)
        for v in h.violations:
            counts[v.rule] = counts.get(v.rule, 0) + 1
        if h.violations:
            broken.append(h)
        if on_history is not None:
            on_history(h)

    while page:
        for stream in page:
            if not isinstance(stream, str):
                # A name that is not text (SQLite): no run id hashes to it, and reading its stream
                # by name would fail. Named as text, U+FFFD for each byte that is not UTF-8.
                orphans.append(stream.decode("utf-8", "replace"))
                done += 1
                if on_progress is not None:
                    total = max(total, done)
                    on_progress(done, total)
                continue
            read = _read_stream(store, stream, "replay_all")
            run_id = read.run_id
            if run_id is None:
                orphans.append(stream)
            else:
                tally(_history(run_id, read))
            done += 1
            if on_progress is not None:
                total = max(total, done)
                on_progress(done, total)
        if len(page) < page_size:
            break
        page = _stream_names(store, page[-1], page_size)
    # Runs whose row was claimed or started but whose stream holds no fact were not listed above:
    # every one of their facts was removed (or the row edited). Each is replayed as what it is, a
    # history without facts that its row disagrees with.
    after: str | bytes = ""
    while True:
        held, bare = _held_without_facts(store, after, page_size)
        for run_id in bare:
            if on_progress is not None:
                total += 1
            h = _history(run_id, _read_stream(store, companion_stream(run_id), "replay_all", run_id))
            if h.facts == 0:  # else a fact was appended since the listing: too new for this replay
                tally(h)
            done += 1
            if on_progress is not None:
                on_progress(done, total)
        if len(held) < page_size:
            break
        after = held[-1]
    if on_progress is not None and done != total:  # streams removed by hand while listed: end at the total
        on_progress(done, done)
    broken.sort(key=lambda h: h.run_id)
    return ReplayTotals(runs=runs, intervals=intervals, violations=dict(sorted(counts.items())),
                        unattributed_streams=orphans, broken=broken)


def replay_all(store: Store, *, on_progress: Callable[[int, int], None] | None = None) -> ReplaySummary:
    """Replay every run that has ownership facts, or whose row says it should (``ownership_history``
    of each), with totals.

    A run is found through its companion stream: the run id is the ``runId`` its facts name that
    hashes to that stream. ``histories`` holds every run's history, by run id: its memory grows
    with the store (about a kilobyte a run); ``replay_each`` hands each history over as it is
    replayed instead and keeps only the totals and the runs that break a rule.

    ``on_progress(replayed, total)``, when given, is called with ``(0, total)`` once the companion
    streams are listed (``total`` of them) and after each stream is judged, so the last call has
    ``replayed == total``. An exception it raises (``KeyboardInterrupt`` ...) ends the replay and
    propagates.
    """
    checked_store(store, "replay_all")
    _checked_progress("replay_all", on_progress)
    histories: list[OwnershipHistory] = []
    totals = replay_each(store, histories.append, on_progress=on_progress)
    histories.sort(key=lambda h: h.run_id)
    return ReplaySummary(runs=totals.runs, intervals=totals.intervals, violations=totals.violations,
                         unattributed_streams=totals.unattributed_streams, histories=histories)
