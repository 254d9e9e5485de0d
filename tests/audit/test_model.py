"""Model-based audit test: replay and the OwnershipHistory projection agree with the store.

``OwnershipMachine`` drives the real run store (SQLite and PostgreSQL) and the plain model in
``tests/audit/_model.py`` with the same random steps: create, claim, activate, claim_and_own
(with and without evidence), abandon, steal (each kind of evidence), recover, heartbeat and
reconfirm (readings inside and outside the skew allowance), transition (running, suspended,
terminal, with cancel guards), request_cancel, and a store clock that jumps around the staleness
cutoff. Four owners on three hosts whose clocks disagree by up to 8 s (inside the allowance), one
of them and some run ids shaped like credentials (``sk-...``, ``ghp_...``). After every step:

* the outcome (tag and fields) equals the model's, and so does the row;
* ``ownership_history`` of every run reports zero violations, and its intervals are the model's;
* the ``OwnershipHistory`` projection, caught up, holds exactly replay's intervals.

``ForgeryMachine`` builds legitimate histories, then forges or deletes facts with raw SQL
(triggers dropped first, as an attacker with database access would) and asserts replay names the
broken rule.

Profiles: the bounded CI profile runs by default (a few seconds per backend). Set
``FENCEPOST_AUDIT_PROFILE=long`` for a longer search (hundreds of examples, longer histories);
``FENCEPOST_AUDIT_EXAMPLES`` / ``FENCEPOST_AUDIT_STEPS`` override either profile's counts.
"""

from __future__ import annotations

import os
import uuid

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import text

import fencepost
from fencepost import LivenessEvidence, OwnerId, RunSnapshot
from fencepost.errors import RunStoreError
from fencepost.journal import companion_stream, ownership_history
from fencepost.projections import OwnershipHistory, ProjectionBuilder
from fencepost.runstore.outcomes import Activated
from tests.audit._model import STALE_AFTER_MS, ModelRun, SkewRefused

_PROFILES = {
    "ci": {"max_examples": 12, "stateful_step_count": 25},
    "long": {"max_examples": 300, "stateful_step_count": 60},
}
_profile = dict(_PROFILES[os.environ.get("FENCEPOST_AUDIT_PROFILE", "ci")])
if os.environ.get("FENCEPOST_AUDIT_EXAMPLES"):
    _profile["max_examples"] = int(os.environ["FENCEPOST_AUDIT_EXAMPLES"])
if os.environ.get("FENCEPOST_AUDIT_STEPS"):
    _profile["stateful_step_count"] = int(os.environ["FENCEPOST_AUDIT_STEPS"])
SETTINGS = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck), **_profile)
# The CI profile runs in seconds under the suite's per-test timeout; a longer search asked for by the
# environment runs as long as it needs.
if _profile != _PROFILES["ci"]:
    pytestmark = pytest.mark.timeout(0)

#: Owners and the offset of their host's clock from the store clock (all inside the allowance).
OWNERS = [
    OwnerId("host-a", 101, "nonce-a1"),
    OwnerId("host-a", 102, "nonce-a2"),
    OwnerId("sk-proj-hostb0000000000000001", 7, "ghp_" + "B" * 36),
    OwnerId("host-c", 303, "nonce-c"),
]
OFFSET = {OWNERS[0]: 0, OWNERS[1]: 0, OWNERS[2]: 8_000, OWNERS[3]: -8_000}
KINDS = ["lease-expired", "same-host-pid-dead", "cross-host-unreachable-stale"]
TARGETS = ["running", "suspended", "suspended", "completed", "failed", "cancelled"]
JUMPS = [1, 500, 1_000, 2_000, 8_000, 10_000, 20_000, 29_999, 30_000, 30_001, 31_000, 41_000]
#: Extra lag of one reading beyond the host offset; 2_001+ on the fast host leaves the allowance.
JITTER = [0, 0, 0, -1_000, 1_000, 2_001, 3_000]
STATS: dict[str, list[int]] = {}


def _outcome(o: object) -> tuple:
    return (type(o).__name__, msgspec.structs.asdict(o))  # type: ignore[arg-type]


def _replay_intervals(history) -> list[tuple]:
    return [(i.owner, i.granted_at_ms, i.start_position, i.started_at_ms, i.end_position, i.ended_at_ms, i.ended_by)
            for i in history.intervals]


def projection_intervals(builder: ProjectionBuilder, run_id: str) -> list[tuple]:
    """The projection's ownership intervals of ``run_id``: its activated rows, in activation order."""
    rows = builder.target.read(lambda conn: conn.execute(text(
        "SELECT owner_host_id, owner_pid, owner_nonce, granted_at_ms, activated_position, activated_at_ms, "
        "closed_position, closed_at_ms, closed_by FROM projection_ownership_history "
        "WHERE run_id = :r AND activated_position IS NOT NULL ORDER BY activated_position"), {"r": run_id}).all())
    return [(OwnerId(r[0], int(r[1]), r[2]), r[3], r[4], r[5], r[6], r[7], r[8]) for r in rows]


class OwnershipMachine(RuleBasedStateMachine):
    """Real store and model side by side; replay and projection checked after every step."""

    store: fencepost.Store
    builder: ProjectionBuilder
    backend: str

    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, ModelRun] = {}
        self.steps = 0
        self.history: list[str] = []

    # ------------------------------------------------------------------ helpers
    @property
    def clock(self) -> int:
        return self.store.clock.now_ms()

    def any(self, test) -> bool:
        """Some run satisfies ``test`` (a rule's precondition: keeps the search on useful steps)."""
        return any(test(m) for m in self.model.values())

    def reading(self, owner: OwnerId, jitter: int) -> int:
        return max(0, self.clock + OFFSET[owner] + jitter)

    def check(self, run_id: str, label: str, real_call, model_call) -> None:
        self.steps += 1
        try:
            expected = ("ok", _outcome(model_call()))
        except SkewRefused:
            expected = ("invalid_run",)
        try:
            got = ("ok", _outcome(real_call()))
        except RunStoreError as exc:
            got = (exc.code,)
        self.history.append(f"{label} -> {got}")
        assert got == expected, f"{label}: store {got}, model {expected}"
        m = self.model[run_id]
        m.remember()
        row = self.store.runs.get(run_id)
        assert (row.status, row.owner, row.heartbeat_at_ms, (row.claimant, row.claimed_at_ms)
                if row.claimant else None, row.cancel_requested_at_ms) == (
            m.status, m.owner, m.heartbeat, m.claim, m.cancel), f"{label}: row differs from the model"

    def snapshot(self, m: ModelRun, pick: int) -> RunSnapshot:
        # Mostly the current snapshot; sometimes an older one (a caller that read a while ago).
        return m.snapshots[-1 - pick % len(m.snapshots)] if pick == 5 else m.snapshot()

    def evidence(self, kind: str, about: OwnerId | None, now: int, exact: bool) -> LivenessEvidence:
        return LivenessEvidence(about if about is not None else OWNERS[3], now if exact else now - 1, kind)

    # ------------------------------------------------------------------ rules
    @rule(target=runs, shape=st.sampled_from(["run", "sk-learn-train", "AKIAIOSFODNN7EXAMPLE"]))
    @precondition(lambda self: len(self.model) < 2)
    def create(self, shape: str) -> str:
        run_id = f"{shape}-{uuid.uuid4().hex[:12]}"
        self.store.runs.create(run_id, "{}")
        self.model[run_id] = ModelRun(run_id)
        self.history.append(f"create {run_id}")
        return run_id

    @rule(ms=st.sampled_from(JUMPS))
    def advance(self, ms: int) -> None:
        self.store.clock.advance(ms)
        self.history.append(f"advance {ms}")

    @rule(run_id=runs, who=st.sampled_from(OWNERS), jitter=st.sampled_from(JITTER), pick=st.integers(0, 5))
    def claim(self, run_id: str, who: OwnerId, jitter: int, pick: int) -> None:
        m = self.model[run_id]
        exp, now, clock = self.snapshot(m, pick), self.reading(who, jitter), self.clock
        self.check(run_id, f"claim {run_id} {who.host_id}/{who.pid} now={now} clock={clock} {exp}",
                   lambda: self.store.runs.claim(run_id, exp, who, now), lambda: m.claim_op(exp, who, now, clock))

    @rule(run_id=runs, pick=st.integers(0, 5), stranger=st.sampled_from([None] * 8 + OWNERS))
    @precondition(lambda self: self.any(lambda m: m.tokens))
    def activate(self, run_id: str, pick: int, stranger: OwnerId | None) -> None:
        m = self.model[run_id]
        if m.claim is not None and stranger is None:
            who, token = m.claim
        elif m.tokens:
            who, token = m.tokens[-1 - pick % len(m.tokens)]
            who = stranger or who
        else:
            who, token = stranger or OWNERS[0], 0
        exp, clock = self.snapshot(m, pick), self.clock
        self.check(run_id, f"activate {run_id} {who.host_id}/{who.pid} token={token} clock={clock} {exp}",
                   lambda: self.store.runs.activate(run_id, who, token, exp),
                   lambda: m.activate_op(who, token, exp, clock))

    @rule(run_id=runs, who=st.sampled_from(OWNERS), jitter=st.sampled_from(JITTER), pick=st.integers(0, 5),
          kind=st.sampled_from([None, *KINDS]), exact=st.sampled_from([True, True, True, False]))
    def claim_and_own(self, run_id: str, who: OwnerId, jitter: int, pick: int, kind: str | None,
                      exact: bool) -> None:
        m = self.model[run_id]
        exp, now, clock = self.snapshot(m, pick), self.reading(who, jitter), self.clock
        ev = None if kind is None else self.evidence(kind, exp.owner, now, exact)
        mev = None if ev is None else (ev.kind, ev.expected_owner, ev.checked_at_ms)
        self.check(run_id, f"claim_and_own {run_id} {who.host_id}/{who.pid} now={now} clock={clock} {exp} {mev}",
                   lambda: self.store.runs.claim_and_own(run_id, exp, who, now, ev),
                   lambda: m.claim_and_own_op(exp, who, now, clock, mev))

    @rule(run_id=runs, pick=st.integers(0, 5))
    @precondition(lambda self: self.any(lambda m: m.tokens))
    def abandon(self, run_id: str, pick: int) -> None:
        m = self.model[run_id]
        if m.claim is not None and pick < 4:
            who, token = m.claim
        elif m.tokens:
            who, token = m.tokens[-1 - pick % len(m.tokens)]
        else:
            who, token = OWNERS[pick % 4], 0
        self.check(run_id, f"abandon {run_id} {who.host_id}/{who.pid} token={token}",
                   lambda: self.store.runs.abandon_claim(run_id, who, token), lambda: m.abandon_op(who, token))

    @rule(run_id=runs, who=st.sampled_from(OWNERS), jitter=st.sampled_from(JITTER), pick=st.integers(0, 5),
          kind=st.sampled_from(KINDS), exact=st.sampled_from([True, True, True, False]))
    @precondition(lambda self: self.any(lambda m: m.status == "running"))
    def steal(self, run_id: str, who: OwnerId, jitter: int, pick: int, kind: str, exact: bool) -> None:
        m = self.model[run_id]
        exp, now, clock = self.snapshot(m, pick), self.reading(who, jitter), self.clock
        ev = self.evidence(kind, exp.owner, now, exact or pick < 3)
        mev = (ev.kind, ev.expected_owner, ev.checked_at_ms)
        self.check(run_id, f"steal {run_id} {who.host_id}/{who.pid} now={now} clock={clock} {exp} {mev}",
                   lambda: self.store.runs.steal(run_id, exp, who, now, ev),
                   lambda: m.steal_op(exp, who, now, clock, mev))

    @rule(run_id=runs, who=st.sampled_from(OWNERS), jitter=st.sampled_from(JITTER), pick=st.integers(0, 5),
          kind=st.sampled_from(KINDS))
    @precondition(lambda self: self.any(lambda m: m.tokens))
    def recover(self, run_id: str, who: OwnerId, jitter: int, pick: int, kind: str) -> None:
        m = self.model[run_id]
        if m.claim is not None and pick < 4:
            stale, token = m.claim
        elif m.tokens:
            stale, token = m.tokens[-1 - pick % len(m.tokens)]
        else:
            stale, token = OWNERS[0], 0
        now, clock = self.reading(who, jitter), self.clock
        ev = self.evidence(kind, stale, now, True)
        mev = (ev.kind, ev.expected_owner, ev.checked_at_ms)
        self.check(run_id, f"recover {run_id} {stale.host_id}/{stale.pid} token={token} by {who.host_id} now={now} "
                   f"clock={clock} {kind}",
                   lambda: self.store.runs.recover_claim(run_id, stale, token, who, now, ev),
                   lambda: m.recover_op(stale, token, who, now, clock, mev))

    @rule(run_id=runs, who=st.sampled_from(OWNERS), jitter=st.sampled_from(JITTER), reconfirm=st.booleans(),
          current=st.booleans())
    @precondition(lambda self: self.any(lambda m: m.status == "running"))
    def heartbeat(self, run_id: str, who: OwnerId, jitter: int, reconfirm: bool, current: bool) -> None:
        m = self.model[run_id]
        if current and m.owner is not None:
            who = m.owner
        now, clock = self.reading(who, jitter), self.clock
        op = self.store.runs.reconfirm if reconfirm else self.store.runs.heartbeat
        self.check(run_id, f"{'reconfirm' if reconfirm else 'heartbeat'} {run_id} {who.host_id}/{who.pid} now={now} "
                   f"clock={clock}",
                   lambda: op(run_id, who, now), lambda: m.heartbeat_op(who, now, clock, reconfirm=reconfirm))

    @rule(run_id=runs, to=st.sampled_from(TARGETS), guard=st.sampled_from([None, None, "absent", "present"]),
          stranger=st.sampled_from([None] * 8 + OWNERS))
    @precondition(lambda self: self.any(lambda m: m.status == "running"))
    def transition(self, run_id: str, to: str, guard: str | None, stranger: OwnerId | None) -> None:
        m = self.model[run_id]
        who = stranger or m.owner or OWNERS[0]
        g = None if guard is None else {"cancel_requested": guard}
        clock = self.clock
        self.check(run_id, f"transition {run_id} {who.host_id}/{who.pid} -> {to} guard={guard}",
                   lambda: self.store.runs.transition_owned(run_id, who, to, None, g),
                   lambda: m.transition_op(who, to, guard, clock))

    @rule(run_id=runs)
    def cancel(self, run_id: str) -> None:
        m = self.model[run_id]
        now = self.clock
        self.check(run_id, f"request_cancel {run_id}", lambda: self.store.runs.request_cancel(run_id, now),
                   lambda: m.cancel_op(now))

    # ------------------------------------------------------------------ the audit
    @invariant()
    def replay_and_projection_agree(self) -> None:
        if not self.model:
            return
        self.builder.catch_up()
        for run_id, m in self.model.items():
            history = ownership_history(self.store, run_id)
            assert history.violations == [], (
                f"replay of {run_id} reports {[(v.rule, v.seq) for v in history.violations]}")
            assert [[i.owner, i.ended_by] for i in history.intervals] == m.intervals, (
                f"replay intervals of {run_id} differ from the model")
            assert projection_intervals(self.builder, run_id) == _replay_intervals(history), (
                f"projection intervals of {run_id} differ from replay")

    def teardown(self) -> None:
        stats = STATS.setdefault(self.backend, [0, 0])
        stats[0] += 1
        stats[1] += self.steps


def _run(machine: type[RuleBasedStateMachine], store: fencepost.Store, db_url: str, backend: str) -> None:
    with ProjectionBuilder(store, db_url, OwnershipHistory()) as builder:
        machine.store, machine.builder, machine.backend = store, builder, backend  # type: ignore[attr-defined]
        run_state_machine_as_test(machine, settings=SETTINGS)
    examples, steps = STATS.get(backend, [0, 0])
    print(f"\n[audit] {machine.__name__} on {backend}: {examples} examples, {steps} store steps")


@pytest.fixture
def clock():
    from fencepost.clock import ManualClock

    return ManualClock(1_700_000_000_000)


def test_replay_and_projection_agree_with_the_store_on_every_admitted_history(
        store: fencepost.Store, db_url: str, backend: str) -> None:
    """Issue 11: zero violations, model outcomes, and projection == replay, after every step."""
    STATS.pop(backend, None)
    _run(OwnershipMachine, store, db_url, backend)
    assert STATS[backend][1] > 0


# ============================================================================ forgeries
MALLORY = OwnerId("host-m", 666, "nonce-m")
SCRIPTS = ["two-phase", "claim-and-own", "steal-handover", "suspend-reclaim", "abandoned-steal", "recovered"]


def _drop_append_only_triggers(store: fencepost.Store) -> None:
    """What an attacker with database access does first (found in the catalog, whatever their names)."""
    with store.db.connect() as conn:
        if store.db.name == "postgresql":
            names = conn.execute(text("SELECT tgname FROM pg_trigger WHERE tgrelid = 'flows_journal_events'::regclass "
                                      "AND NOT tgisinternal")).scalars().all()
            for name in names:
                conn.execute(text(f'DROP TRIGGER "{name}" ON flows_journal_events'))
        else:
            names = conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger' "
                                      "AND tbl_name = 'flows_journal_events'")).scalars().all()
            for name in names:
                conn.execute(text(f'DROP TRIGGER "{name}"'))
        conn.commit()


class ForgeryMachine(RuleBasedStateMachine):
    """Legitimate histories, then one forgery or deletion each with raw SQL: replay names it."""

    store: fencepost.Store
    builder: ProjectionBuilder
    backend: str

    clean = Bundle("clean")

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    # ------------------------------------------------------------------ raw SQL
    def facts(self, run_id: str) -> list[dict]:
        with self.store.db.connect() as conn:
            rows = conn.execute(text(
                "SELECT position, seq, event_type, payload_json FROM flows_journal_events WHERE run_id = :s "
                "ORDER BY seq"), {"s": companion_stream(run_id)}).all()
        return [{"position": r[0], "seq": r[1], "kind": r[2].rsplit(".", 1)[1], "payload": msgspec.json.decode(r[3])}
                for r in rows]

    def sql(self, statement: str, **params: object) -> None:
        with self.store.db.connect() as conn:
            conn.execute(text(statement), params)
            conn.commit()

    def delete(self, position: int) -> None:
        self.sql("DELETE FROM flows_journal_events WHERE position = :p", p=position)

    def rewrite(self, position: int, payload: dict) -> None:
        self.sql("UPDATE flows_journal_events SET payload_json = :j WHERE position = :p",
                 j=msgspec.json.encode(payload).decode(), p=position)

    def insert(self, run_id: str, kind: str, payload: dict) -> None:
        stream = companion_stream(run_id)
        with self.store.db.connect() as conn:
            position = conn.execute(text("SELECT COALESCE(MAX(position), 0) + 1 FROM flows_journal_events")).scalar()
            seq, source_seq = conn.execute(text(
                "SELECT COALESCE(MAX(seq), -1) + 1, COALESCE(MAX(source_seq), -1) + 1 FROM flows_journal_events "
                "WHERE run_id = :s"), {"s": stream}).one()
            conn.execute(text(
                "INSERT INTO flows_journal_events (run_id, seq, event_id, source_id, source_seq, emitted_at_ms, "
                "event_type, payload_json, meta_json, content_hash, position, stream_prev_hash, log_prev_hash, "
                "entry_hash) VALUES (:s, :seq, :eid, 'flows.run-store', :sseq, :at, :t, :p, :m, :h, :pos, :h, :h, :h)"),
                {"s": stream, "seq": seq, "eid": f"forged:{uuid.uuid4().hex}", "sseq": source_seq,
                 "at": self.store.clock.now_ms(), "t": f"flows.consensus.{kind}",
                 "p": msgspec.json.encode(payload).decode(),
                 "m": msgspec.json.encode({"runId": run_id}).decode(), "h": "0" * 64, "pos": position})
            conn.commit()

    def expect(self, run_id: str, rule: str) -> None:
        self.steps += 1
        found = [v.rule for v in ownership_history(self.store, run_id).violations]
        assert rule in found, f"replay of {run_id} after the forgery reports {found}, not {rule}"

    # ------------------------------------------------------------------ legitimate histories
    @rule(target=clean, script=st.sampled_from(SCRIPTS), a=st.sampled_from(OWNERS), b=st.sampled_from(OWNERS),
          ahead=st.sampled_from([0, 8_000, -8_000]))
    def history(self, script: str, a: OwnerId, b: OwnerId, ahead: int) -> str:
        runs, clock = self.store.runs, self.store.clock
        run_id = f"{script}-{uuid.uuid4().hex[:10]}"
        runs.create(run_id, "{}")
        pending = RunSnapshot("pending", None, None)
        now = clock.now_ms()
        if script == "claim-and-own":
            assert isinstance(runs.claim_and_own(run_id, pending, a, now + ahead), Activated)
        else:
            claimed = runs.claim(run_id, pending, a, now + ahead)
            if script == "recovered":
                clock.advance(30_001 + max(ahead, 0))
                t = clock.now_ms()
                runs.recover_claim(run_id, a, claimed.claimed_at_ms, b, t, LivenessEvidence(a, t, "lease-expired"))
            else:
                runs.activate(run_id, a, claimed.claimed_at_ms, pending)
        if script in ("steal-handover", "abandoned-steal", "suspend-reclaim"):
            clock.advance(31_000)
            t = clock.now_ms()
            snap = runs.get(run_id).snapshot()
            got = runs.steal(run_id, snap, b, t, LivenessEvidence(a, t, "lease-expired"))
            if script == "steal-handover":
                runs.activate(run_id, b, got.claimed_at_ms, snap)
            elif script == "abandoned-steal":
                runs.abandon_claim(run_id, b, got.claimed_at_ms)
            else:
                runs.transition_owned(run_id, a, "suspended")
                runs.claim(run_id, RunSnapshot("suspended", None, None), b, t)
        if script == "two-phase":
            runs.transition_owned(run_id, a, "completed")
        history = ownership_history(self.store, run_id)
        assert history.ok, (script, [v.rule for v in history.violations])
        self.steps += 1
        return run_id

    # ------------------------------------------------------------------ forgeries
    @rule(run_id=consumes(clean))
    def delete_a_consumed_claim(self, run_id: str) -> None:
        facts = self.facts(run_id)
        for i, f in enumerate(facts):
            if f["kind"] == "activated" and i > 0 and facts[i - 1]["kind"] in ("claimed", "stolen"):
                self.delete(facts[i - 1]["position"])
                self.expect(run_id, "activated_without_claim")
                return

    @rule(run_id=consumes(clean))
    def delete_the_owners_release(self, run_id: str) -> None:
        facts = self.facts(run_id)
        for i, f in enumerate(facts):
            if f["kind"] == "released" and f["payload"]["grantedAtMs"] is None and any(
                    g["kind"] == "claimed" for g in facts[i + 1:]):
                self.delete(f["position"])
                self.expect(run_id, "claim_while_owned")
                return

    @rule(run_id=consumes(clean))
    def forge_an_activation(self, run_id: str) -> None:
        self.insert(run_id, "activated", {"runId": run_id, "owner": MALLORY.to_json(), "grantedAtMs": 1,
                                          "heartbeatAtMs": self.store.clock.now_ms()})
        self.expect(run_id, "activated_without_claim")

    @rule(run_id=consumes(clean))
    def forge_a_steal_of_a_fresh_owner(self, run_id: str) -> None:
        h = ownership_history(self.store, run_id)
        now = self.store.clock.now_ms()
        holder = h.intervals[-1].owner if h.intervals else OWNERS[0]
        self.insert(run_id, "stolen", {"runId": run_id, "owner": MALLORY.to_json(), "grantedAtMs": now,
                                       "holder": holder.to_json(), "holderHeartbeatAtMs": now,
                                       "cutoffMs": now - STALE_AFTER_MS, "evidence": "lease-expired"})
        open_now = bool(h.intervals) and h.intervals[-1].ended_by is None
        self.expect(run_id, "stolen_while_fresh" if open_now else "stolen_without_owner")

    @rule(run_id=consumes(clean))
    def rewrite_a_steals_reading(self, run_id: str) -> None:
        for f in self.facts(run_id):
            if f["kind"] == "stolen":
                self.rewrite(f["position"], {**f["payload"], "holderHeartbeatAtMs": f["payload"]["cutoffMs"]})
                self.expect(run_id, "stolen_while_fresh")
                return

    @rule(run_id=consumes(clean))
    def rewrite_a_releaser(self, run_id: str) -> None:
        for f in self.facts(run_id):
            if f["kind"] == "released":
                self.rewrite(f["position"], {**f["payload"], "owner": MALLORY.to_json()})
                self.expect(run_id, "released_without_hold")
                return

    @rule(run_id=consumes(clean))
    def rewrite_the_run_id(self, run_id: str) -> None:
        f = self.facts(run_id)[0]
        self.rewrite(f["position"], {**f["payload"], "runId": run_id + "-other"})
        self.expect(run_id, "wrong_run")

    def teardown(self) -> None:
        stats = STATS.setdefault("forge-" + self.backend, [0, 0])
        stats[0] += 1
        stats[1] += self.steps


def test_replay_names_every_forged_or_deleted_fact(store: fencepost.Store, db_url: str, backend: str) -> None:
    """Issue 11: forged and deleted facts (raw SQL, triggers dropped) are named by replay."""
    _drop_append_only_triggers(store)
    STATS.pop("forge-" + backend, None)
    with ProjectionBuilder(store, db_url, OwnershipHistory()) as builder:
        ForgeryMachine.store, ForgeryMachine.builder, ForgeryMachine.backend = store, builder, backend
        run_state_machine_as_test(ForgeryMachine, settings=SETTINGS)
    examples, steps = STATS["forge-" + backend]
    print(f"\n[audit] ForgeryMachine on {backend}: {examples} examples, {steps} checked histories")
    assert steps > 0
