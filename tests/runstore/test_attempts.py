"""AttemptStore (UPSTREAM-TESTS A10: AS, AB, AO)."""

from __future__ import annotations

import math

import pytest

import fencepost
from fencepost import (
    Attempt,
    AttemptPolicy,
    AttemptStore,
    AttemptStoreError,
    Conflict,
    ExistingSame,
    FenceLost,
    Finished,
    Inserted,
    NotFound,
    Patched,
    RunNotFound,
    StateChanged,
    Updated,
    Upserted,
)
from fencepost.journal.owner import OwnerId

from ._corrupt import disable_check_constraints
from .conftest import PENDING, fresh, raw_exec, revision

OWN = OwnerId("host-a", 42, "nonce-a")
STALE = OwnerId("host-a", 42, "nonce-old")


@pytest.fixture
def run1(mstore):
    """A running run owned by OWN (fresh id per test) and the module store."""
    rid = fresh("run")
    mstore.runs.create(rid, "{}")
    mstore.runs.claim_and_own(rid, PENDING, OWN, mstore.clock.now_ms())
    return mstore, rid


def att(rid, **kw):
    base = dict(run_id=rid, step_key_digest="digest-1", attempt=0, state="running", started_at_ms=10)
    base.update(kw)
    return Attempt(**base)


def test_put_then_get_returns_exactly_the_fields(run1):
    """AS-01."""
    s, rid = run1
    a = att(rid, heartbeat_at_ms=11, checkpoint={"cursor": 2}, meta={"discardCheckpoint": True,
                                                                      "nested": {"value": "opaque"}})
    assert s.attempts.put(a, OWN) == Inserted()
    assert s.attempts.get(rid, "digest-1", 0) == a
    assert s.attempts.get(rid, "digest-1", 0).finished_at_ms is None


def test_finish_keeps_meta_unless_given_and_replaces_outcome(run1):
    """AS-02, AS-03, AS-04, AS-05, AO-03."""
    s, rid = run1
    s.attempts.put(att(rid, meta={"m": 1}, outcome="mid-flight", error={"e": 0}), OWN)
    assert s.attempts.patch(rid, "digest-1", 0, OWN, outcome={"responseText": "x", "worktreeRef": "w"}) == Patched()
    assert s.attempts.finish(att(rid, state="failed", finished_at_ms=20), OWN) == Finished()
    got = s.attempts.get(rid, "digest-1", 0)
    assert (got.meta, got.outcome, got.error, got.finished_at_ms) == (
        {"m": 1}, {"responseText": "x", "worktreeRef": "w"}, {"e": 0}, 20)
    s.attempts.put(att(rid, attempt=1, outcome="mid-flight"), OWN)
    s.attempts.finish(att(rid, attempt=1, state="completed", finished_at_ms=20, outcome="terminal",
                          meta={"agentChainIndex": 1, "discardResumeSession": True}, error={"new": 1}), OWN)
    got = s.attempts.get(rid, "digest-1", 1)
    assert (got.outcome, got.meta, got.error) == ("terminal", {"agentChainIndex": 1, "discardResumeSession": True},
                                                  {"new": 1})


def test_attempt_writes_fail_once_the_owner_changes(run1):
    """AS-06."""
    s, rid = run1
    s.attempts.put(att(rid), OWN)
    raw_exec(s, f"UPDATE flows_runs SET owner_nonce = 'changed' WHERE run_id = '{rid}'")
    assert s.attempts.heartbeat(rid, "digest-1", 0, OWN, 12) == FenceLost()


def test_attempt_heartbeat_keeps_checkpoint_and_is_monotonic(run1):
    """AS-07, AS-13."""
    s, rid = run1
    s.attempts.put(att(rid, heartbeat_at_ms=11), OWN)
    assert s.attempts.heartbeat(rid, "digest-1", 0, OWN, 12, {"cp": 1}) == Updated(12)
    assert s.attempts.heartbeat(rid, "digest-1", 0, OWN, 13) == Updated(13)
    assert s.attempts.heartbeat(rid, "digest-1", 0, OWN, 5) == Updated(13)
    assert s.attempts.heartbeat(rid, "missing", 0, OWN, 14) == NotFound()
    assert s.attempts.get(rid, "missing", 0) is None
    got = s.attempts.get(rid, "digest-1", 0)
    assert (got.heartbeat_at_ms, got.checkpoint) == (13, {"cp": 1})
    s.attempts.finish(att(rid, state="completed", finished_at_ms=20), OWN)
    assert s.attempts.heartbeat(rid, "digest-1", 0, OWN, 30) == StateChanged()
    assert s.attempts.get(rid, "digest-1", 0).heartbeat_at_ms == 13


def test_attempts_coexist(run1):
    """AS-08."""
    s, rid = run1
    s.attempts.put(att(rid), OWN)
    s.attempts.finish(att(rid, state="failed", finished_at_ms=20), OWN)
    s.attempts.put(att(rid, attempt=1), OWN)
    assert [s.attempts.get(rid, "digest-1", i).state for i in (0, 1)] == ["failed", "running"]


def test_put_idempotency_and_fence(run1):
    """AS-09, AS-10, AS-11; AS-12: stored and given JSON compare as values: key order ignored, array
    order kept, ``1 == 1.0`` (one JSON number type), ``true`` is not ``1``."""
    s, rid = run1
    full = att(rid, finished_at_ms=None, heartbeat_at_ms=11, checkpoint={"a": [1, 2]}, error={"e": 1},
               outcome={"o": True}, meta={"k": "v", "n": 1})
    assert s.attempts.put(full, OWN) == Inserted()
    assert s.attempts.put(full, OWN) == ExistingSame()
    reordered = att(rid, heartbeat_at_ms=11, checkpoint={"a": [1, 2]}, error={"e": 1}, outcome={"o": True},
                    meta={"n": 1.0, "k": "v"})
    assert s.attempts.put(reordered, OWN) == ExistingSame()  # key order ignored; 1 == 1.0 (decisions.md)
    assert s.attempts.put(att(rid, heartbeat_at_ms=11, checkpoint={"a": [1, 2]}, error={"e": 1},
                              outcome={"o": True}, meta={"k": "v", "n": True}), OWN) == Conflict()  # true is not 1
    assert s.attempts.put(att(rid, heartbeat_at_ms=11, checkpoint={"a": [2, 1]}, error={"e": 1},
                              outcome={"o": True}, meta={"k": "v", "n": 1}), OWN) == Conflict()  # array order kept
    assert s.attempts.put(att(rid, heartbeat_at_ms=11, checkpoint={"a": [1, 2]}, error={"e": 1},
                              outcome={"o": 1}, meta={"k": "v", "n": 1}), OWN) == Conflict()  # 1 is not true
    assert s.attempts.put(att(rid, step_key_digest="other"), STALE) == FenceLost()
    assert s.attempts.put(att("missing-run"), OWN) == RunNotFound()


def test_finish_sequence(run1):
    """AS-14: a second finish never overwrites the winner."""
    s, rid = run1
    fin = att(rid, state="completed", finished_at_ms=20, outcome="first")
    assert s.attempts.finish(fin, OWN) == NotFound()
    s.attempts.put(att(rid), OWN)
    assert s.attempts.finish(fin, STALE) == FenceLost()
    assert s.attempts.finish(fin, OWN) == Finished()
    assert s.attempts.finish(att(rid, state="completed", finished_at_ms=21, outcome="second"), OWN) == StateChanged()
    assert s.attempts.get(rid, "digest-1", 0).outcome == "first"


def test_attempt_identity_messages(run1):
    """AS-15."""
    s, rid = run1
    msgs = {}
    for name, call in [
        ("get", lambda: s.attempts.get(rid, "d", -1)),
        ("heartbeat", lambda: s.attempts.heartbeat(rid, "d", -1, OWN, 1)),
        ("patch", lambda: s.attempts.patch(rid, "d", -1, OWN)),
        ("put", lambda: s.attempts.put(att(rid, attempt=-1), OWN)),
        ("finish", lambda: s.attempts.finish(att(rid, attempt=-1, state="completed", finished_at_ms=1), OWN)),
    ]:
        with pytest.raises(AttemptStoreError) as e:
            call()
        msgs[name] = str(e.value)
    detail = "attempt identity violates the durable identifier contract"
    for m in ("get", "heartbeat", "patch"):
        assert msgs[m] == f"invalid_attempt: AttemptStore.{m}: {detail}"
    assert msgs["put"] == "invalid_attempt: AttemptStore.put: attempt violates the persistence contract"
    assert msgs["finish"] == "invalid_attempt: AttemptStore.finish: finished attempt violates the contract"


BAD_PUTS = {
    "empty-run": dict(run_id=""), "empty-digest": dict(step_key_digest=""), "empty-state": dict(state=""),
    "attempt-nan": dict(attempt=math.nan), "attempt-neg": dict(attempt=-1), "started-neg": dict(started_at_ms=-1),
    "started-nan": dict(started_at_ms=math.nan), "finished-neg": dict(finished_at_ms=-1),
    "heartbeat-neg": dict(heartbeat_at_ms=-1), "meta-none": dict(meta=None), "checkpoint-set": dict(checkpoint={1}),
    "error-nan": dict(error=math.nan), "outcome-bytes": dict(outcome=b"x"), "meta-tuple": dict(meta=(1,)),
    "checkpoint-1mib": dict(checkpoint="x" * (1024 * 1024)), "surrogate": dict(meta={"k": "\ud800"}),
}


@pytest.mark.parametrize("kw", list(BAD_PUTS.values()), ids=list(BAD_PUTS))
def test_invalid_puts_write_nothing(run1, kw):
    """AS-16, AB-04."""
    s, rid = run1
    before = revision(s)
    with pytest.raises(AttemptStoreError) as e:
        s.attempts.put(att(rid, **kw), OWN)
    assert e.value.code == "invalid_attempt"
    assert s.attempts.get(rid, "digest-1", 0) is None and revision(s) == before


@pytest.mark.parametrize("bad", [None, "owner", OwnerId("", 1, "n"), OwnerId("h", -1, "n"), OwnerId("h", 1.5, "n"),
                                 OwnerId("h", 1, "")], ids=["none", "str", "empty-host", "neg-pid", "frac-pid",
                                                            "empty-nonce"])
def test_bad_owners_are_refused_everywhere(run1, bad):
    """AB-02."""
    s, rid = run1
    s.attempts.put(att(rid), OWN)
    for call in (lambda: s.attempts.put(att(rid, attempt=5), bad),
                 lambda: s.attempts.heartbeat(rid, "digest-1", 0, bad, 1),
                 lambda: s.attempts.finish(att(rid, state="done", finished_at_ms=1), bad),
                 lambda: s.attempts.patch(rid, "digest-1", 0, bad, meta={})):
        with pytest.raises(AttemptStoreError) as e:
            call()
        assert e.value.code == "invalid_attempt"
    assert s.attempts.get(rid, "digest-1", 0) == att(rid)


def test_bad_finish_and_heartbeat_inputs(run1):
    """AS-16 (heartbeat, finish), AO-02."""
    s, rid = run1
    s.attempts.put(att(rid), OWN)
    for call in (lambda: s.attempts.heartbeat(rid, "digest-1", 0, OWN, -1),
                 lambda: s.attempts.heartbeat(rid, "digest-1", 0, OWN, math.nan),
                 lambda: s.attempts.heartbeat(rid, "digest-1", 0, OWN, 1, math.inf),
                 lambda: s.attempts.finish(att(rid, state="", finished_at_ms=1), OWN),
                 lambda: s.attempts.finish(att(rid, state="running", finished_at_ms=1), OWN),
                 lambda: s.attempts.finish(att(rid, state="done", finished_at_ms=-1), OWN),
                 lambda: s.attempts.finish(None, OWN),
                 lambda: s.attempts.patch(rid, "digest-1", 0, OWN, error=math.nan)):
        with pytest.raises(AttemptStoreError):
            call()


@pytest.mark.parametrize("column,value", [
    ("checkpoint_json", "'not-json'"), ("error_json", "'not-json'"), ("outcome_json", "'not-json'"),
    ("meta_json", "'not-json'"), ("state", "''"), ("started_at_ms", "-1"), ("finished_at_ms", "-1"),
    ("heartbeat_at_ms", "-1"),
], ids=lambda v: str(v).strip("'"))
def test_corrupt_attempt_rows_fail_decode(store, column, value):
    """AS-17, AS-18: attempt rows written with the CHECK constraints out of the way."""
    store.runs.create("run-1", "{}")
    store.runs.claim_and_own("run-1", PENDING, OWN, 0)
    store.attempts.put(att("run-1"), OWN)
    with store.db.connect() as conn:
        disable_check_constraints(conn, "flows_attempts")
        conn.exec_driver_sql(f"UPDATE flows_attempts SET {column} = {value}")
        conn.commit()
    with pytest.raises(AttemptStoreError) as e:
        store.attempts.get("run-1", "digest-1", 0)
    assert e.value.code == "decode_failed"


def test_timestamps_are_checked_one_by_one(run1):
    """AB-06."""
    s, rid = run1
    a = att(rid, started_at_ms=1, finished_at_ms=0, heartbeat_at_ms=0)
    assert s.attempts.put(a, OWN) == Inserted()
    assert s.attempts.get(rid, "digest-1", 0) == a


def test_attempt_values_are_never_redacted(run1):
    """RX-04, RX-05."""
    s, rid = run1
    v = {"payload": {"pageToken": "page-2", "clientSecret": {"rotationMs": 900, "scopes": ["read"]}, "retries": 3}}
    s.attempts.put(att(rid, checkpoint=v, meta=v), OWN)
    s.attempts.finish(att(rid, state="done", finished_at_ms=2, error=v, outcome=v), OWN)
    got = s.attempts.get(rid, "digest-1", 0)
    assert got.checkpoint == got.meta == got.error == got.outcome == v
    s.attempts.patch(rid, "digest-1", 0, OWN, checkpoint={"x": v})
    assert s.attempts.get(rid, "digest-1", 0).checkpoint == {"x": v}


def test_patch_rules(run1):
    """AO-06: patch keeps what it is not given, works on terminal attempts, is fenced."""
    s, rid = run1
    s.attempts.put(att(rid, error={"e": 1}), OWN)
    s.attempts.finish(att(rid, state="failed", finished_at_ms=3), OWN)
    assert s.attempts.patch(rid, "digest-1", 0, OWN, meta={"m": 2}) == Patched()
    got = s.attempts.get(rid, "digest-1", 0)
    assert (got.error, got.state, got.meta) == ({"e": 1}, "failed", {"m": 2})
    assert s.attempts.patch(rid, "missing", 0, OWN, meta={}) == NotFound()
    assert s.attempts.patch(rid, "digest-1", 0, OWN) == Patched()
    assert s.attempts.patch(rid, "digest-1", 0, STALE, meta={}) == FenceLost()
    s.attempts.patch(rid, "digest-1", 0, OWN, checkpoint=1, error=2, outcome=3, meta=4)
    got = s.attempts.get(rid, "digest-1", 0)
    assert (got.checkpoint, got.error, got.outcome, got.meta) == (1, 2, 3, 4)


def test_terminal_run_fences_every_attempt_write(run1):
    """Seed fencing.md: once a run settles, later attempt writes report FenceLost."""
    s, rid = run1
    s.attempts.put(att(rid), OWN)
    s.runs.transition_owned(rid, OWN, "completed")
    assert s.attempts.heartbeat(rid, "digest-1", 0, OWN, 5) == FenceLost()
    assert s.attempts.put(att(rid, attempt=1), OWN) == FenceLost()


@pytest.mark.parametrize("policy", [
    "policy", AttemptPolicy(in_progress_states=()), AttemptPolicy(in_progress_states=("a", "a")),
    AttemptPolicy(in_progress_states=("",)), AttemptPolicy(max_checkpoint_bytes=0),
    AttemptPolicy(max_checkpoint_bytes=1.5), AttemptPolicy(max_checkpoint_bytes=16 * 1024 * 1024 + 1),
    AttemptPolicy(put_mode="replace"), AttemptPolicy(in_progress_states={"running": 1}),
], ids=["str", "empty", "dupes", "blank", "cap-0", "cap-frac", "cap-over", "mode", "dict"])
def test_invalid_policies_fail_at_build_time(db_url, clock, policy):
    """AB-05."""
    with pytest.raises(AttemptStoreError) as e:
        fencepost.open(db_url, clock=clock, attempt_policy=policy)
    assert e.value.code == "invalid_attempt"


def test_custom_policy_states_caps_and_upsert(db_url, clock):
    """AO-01, AO-02, AO-04, AO-05."""
    policy = AttemptPolicy(in_progress_states=("in-progress", "retrying"), max_checkpoint_bytes=32, put_mode="upsert")
    with fencepost.open(db_url, clock=clock, attempt_policy=policy) as s:
        s.runs.create("run-1", "{}")
        s.runs.claim_and_own("run-1", PENDING, OWN, 0)
        a = att("run-1", state="in-progress")
        assert s.attempts.put(a, OWN) == Inserted()
        assert s.attempts.heartbeat("run-1", "digest-1", 0, OWN, 11) == Updated(11)
        assert s.attempts.put(att("run-1", state="in-progress", started_at_ms=9, meta={"a": 2}), OWN) == Upserted()
        assert s.attempts.get("run-1", "digest-1", 0).meta == {"a": 2}
        assert s.attempts.put(att("run-1", state="in-progress", meta={"a": 3}), STALE) == FenceLost()
        with pytest.raises(AttemptStoreError):
            s.attempts.finish(att("run-1", state="retrying", finished_at_ms=1), OWN)
        with pytest.raises(AttemptStoreError):
            s.attempts.heartbeat("run-1", "digest-1", 0, OWN, 12, "x" * 64)
        assert s.attempts.finish(att("run-1", state="succeeded", finished_at_ms=20), OWN) == Finished()
        assert s.attempts.put(att("run-1", state="in-progress", meta={"a": 4}), OWN) == Conflict()  # terminal is final
    big = AttemptPolicy(max_checkpoint_bytes=8 * 1024 * 1024)
    with fencepost.open(db_url, clock=clock, attempt_policy=big) as s:
        s.runs.create("run-2", "{}")
        s.runs.claim_and_own("run-2", PENDING, OWN, 0)
        assert s.attempts.put(att("run-2", checkpoint="x" * (2 * 1024 * 1024)), OWN) == Inserted()


def test_default_mode_conflicts_on_re_put(run1):
    """AO-04 (default mode)."""
    s, rid = run1
    s.attempts.put(att(rid), OWN)
    assert s.attempts.put(att(rid, started_at_ms=9, meta={"a": 2}), OWN) == Conflict()


def test_noop_attempt_store_is_unknown():
    """AO-06 (noop), seed compose-the-stores noop table."""
    noop = AttemptStore.noop()
    with pytest.raises(AttemptStoreError) as e:
        noop.patch("r", "d", 0, OWN)
    assert e.value.code == "unknown"
    assert AttemptStore.noop(get=lambda *a: None).get("r", "d", 0) is None
    assert AttemptStore.MAXIMUM_CHECKPOINT_BYTES == 16 * 1024 * 1024
    assert (AttemptStore.MAXIMUM_JSON_DEPTH, AttemptStore.MAXIMUM_JSON_NODES) == (128, 100_000)


def test_of_run_lists_every_attempt_of_one_run_oldest_first(run1):
    """``of_run``: the run's attempts only, ordered by start then step then attempt, bounded by limit."""
    s, rid = run1
    other = fresh("run")
    s.runs.create(other, "{}")
    s.runs.claim_and_own(other, PENDING, OWN, s.clock.now_ms())
    a2 = att(rid, step_key_digest="digest-2", started_at_ms=30, checkpoint={"n": 1})
    a1 = att(rid, started_at_ms=20)
    a1b = att(rid, attempt=1, started_at_ms=20)
    for a in (a2, a1, a1b):
        assert s.attempts.put(a, OWN) == Inserted()
    assert s.attempts.put(att(other), OWN) == Inserted()
    assert s.attempts.of_run(rid) == [a1, a1b, a2]
    assert s.attempts.of_run(rid, limit=2) == [a1, a1b]
    assert s.attempts.of_run(fresh("absent")) == []
    for bad in ({"run_id": ""}, {"run_id": rid, "limit": 0}, {"run_id": rid, "limit": 10_001}):
        with pytest.raises(AttemptStoreError) as e:
            s.attempts.of_run(bad.pop("run_id"), **bad)
        assert e.value.code == "invalid_attempt"


def _driver_error(store, kind: str):
    """A driver error as the backend raises it: a constraint violation, or an I/O failure."""
    import sqlite3

    import psycopg
    from sqlalchemy.exc import DBAPIError

    if store.db.name == "sqlite":
        orig = (sqlite3.IntegrityError("UNIQUE constraint failed") if kind == "constraint"
                else sqlite3.OperationalError("disk I/O error"))
        orig.sqlite_errorname = "SQLITE_CONSTRAINT_UNIQUE" if kind == "constraint" else "SQLITE_IOERR"
        return DBAPIError.instance(None, None, orig, sqlite3.Error)
    orig = (psycopg.errors.UniqueViolation("duplicate key") if kind == "constraint"
            else psycopg.errors.IoError("could not read block"))
    return DBAPIError.instance(None, None, orig, psycopg.Error)


@pytest.mark.parametrize("kind,code", [("constraint", "constraint"), ("io", "persistence_failed")],
                         ids=["constraint", "other"])
def test_get_over_failing_sql_maps_the_failure_class(run1, monkeypatch, kind, code):
    """AS-19: a constraint-class failure under ``get`` is ``constraint``, anything else
    ``persistence_failed``; the cause names the category and the driver's code, never a value."""
    from fencepost.runstore import _sql as q

    s, rid = run1
    real = q.run

    def run(conn, stmt, params):
        if stmt is q.SELECT_ATTEMPT:
            raise _driver_error(s, kind)
        return real(conn, stmt, params)

    monkeypatch.setattr(q, "run", run)
    with pytest.raises(AttemptStoreError) as e:
        s.attempts.get(rid, "digest-1", 0)
    assert e.value.code == code
    assert str(e.value).startswith(f"{code}: AttemptStore.get: attempt persistence failed")
    assert e.value.cause["category"] == code and e.value.cause["code"]
    chain, link = [], e.value
    while link is not None:
        chain.append(type(link).__name__)
        link = link.__cause__ or link.__context__
    assert chain in (["AttemptStoreError"], ["AttemptStoreError", "DbFailure"])  # the driver's error is not kept


def test_an_attempt_store_error_inside_get_passes_through(run1, monkeypatch):
    """AS-19: an ``AttemptStoreError`` already raised (``unknown``) reaches the caller unchanged."""
    from fencepost.runstore import _sql as q

    s, rid = run1
    raised = AttemptStoreError("unknown", "get", "attempt store unavailable")

    def run(conn, stmt, params):
        raise raised

    monkeypatch.setattr(q, "run", run)
    with pytest.raises(AttemptStoreError) as e:
        s.attempts.get(rid, "digest-1", 0)
    assert e.value is raised and e.value.code == "unknown"


def test_a_stored_attempts_identity_addresses_get_and_patch(run1):
    """AS-20 (Python analogue: identity is three arguments, not an id object): the identity read
    back from a stored attempt addresses get and patch; a patched checkpoint reads back."""
    s, rid = run1
    s.attempts.put(att(rid, meta={"k": "v"}), OWN)
    stored = s.attempts.of_run(rid)[0]
    ident = (stored.run_id, stored.step_key_digest, stored.attempt)
    assert s.attempts.get(*ident) == stored
    assert s.attempts.patch(*ident, OWN, checkpoint={"cursor": 2}) == Patched()
    assert s.attempts.get(*ident).checkpoint == {"cursor": 2}


class _CountingStr(str):
    """A ``str`` subclass that records every method call made on it."""

    calls: list[str] = []

    def __len__(self):
        _CountingStr.calls.append("len")
        return super().__len__()

    def isascii(self):
        _CountingStr.calls.append("isascii")
        return super().isascii()


BAD_IDENTITIES = {
    "run-id-str-subclass": (_CountingStr("run-x"), "digest-1", 0),
    "digest-str-subclass": ("run-x", _CountingStr("digest-1"), 0),
    "attempt-bool": ("run-x", "digest-1", False),
    "attempt-float": ("run-x", "digest-1", 0.0),
    "attempt-missing": ("run-x", "digest-1", None),
    "attempt-str": ("run-x", "digest-1", "0"),
    "run-id-date": (__import__("datetime").date(2026, 1, 1), "digest-1", 0),
}


@pytest.mark.parametrize("ident", list(BAD_IDENTITIES.values()), ids=list(BAD_IDENTITIES))
def test_identities_of_the_wrong_type_are_refused_unread(run1, ident):
    """AS-21 [JS] analogue: an identity part that is not exactly ``str`` / ``int`` (a subclass, a
    bool, a float, None, a date) is ``invalid_attempt`` for get, heartbeat and patch, and nothing
    on the object is called (the type is checked first)."""
    s, _ = run1
    _CountingStr.calls = []
    for call in (lambda: s.attempts.get(*ident), lambda: s.attempts.heartbeat(*ident, OWN, 1),
                 lambda: s.attempts.patch(*ident, OWN, meta={})):
        with pytest.raises(AttemptStoreError) as e:
            call()
        assert e.value.code == "invalid_attempt"
    assert _CountingStr.calls == []


class _ReadCountingAttempt(Attempt):
    """An ``Attempt`` subclass whose ``state`` is a property: it records each read."""

    reads = 0

    @property
    def state(self):  # type: ignore[override]
        _ReadCountingAttempt.reads += 1
        return "running"


class _ExtraAttempt(Attempt):
    """An ``Attempt`` subclass that only adds an attribute."""

    extra = "ignored?"


def test_only_an_exact_attempt_is_accepted_and_nothing_else_is_read(run1):
    """AB-01 [JS] analogue: put and finish refuse None, a date, a dict of the fields, an ``Attempt``
    subclass with a property (never read) and one that only adds an attribute (Python has no
    non-enumerable key to ignore: the exact type is the rule); nothing is written."""
    import datetime

    s, rid = run1
    fields = dict(run_id=rid, step_key_digest="digest-1", attempt=0, state="running", started_at_ms=10)
    _ReadCountingAttempt.reads = 0
    bad = [None, datetime.datetime(2026, 1, 1), fields, _ReadCountingAttempt(**fields), _ExtraAttempt(**fields)]
    before = revision(s)
    for value in bad:
        for call in (lambda v=value: s.attempts.put(v, OWN), lambda v=value: s.attempts.finish(v, OWN)):
            with pytest.raises(AttemptStoreError) as e:
                call()
            assert e.value.code == "invalid_attempt"
    assert _ReadCountingAttempt.reads == 0
    assert s.attempts.get(rid, "digest-1", 0) is None and revision(s) == before
    assert s.attempts.put(Attempt(**fields), OWN) == Inserted()


class _FlappingOwner(OwnerId):
    """An ``OwnerId`` subclass answering a different host on every other read of ``host_id``."""

    reads = 0

    @property
    def host_id(self):  # type: ignore[override]
        _FlappingOwner.reads += 1
        return "host-a" if _FlappingOwner.reads % 2 else "host-z"


def test_owner_is_taken_by_value_and_a_flapping_owner_is_never_read(run1):
    """AB-03 [JS] analogue: an owner is a frozen, exact ``OwnerId`` taken by value, so put,
    heartbeat, patch and finish answer Inserted, Updated, Patched, Finished; an ``OwnerId``
    subclass whose host changes between reads is refused by each of them without one read through it."""
    s, rid = run1
    flapping = _FlappingOwner("host-a", 42, "nonce-a")
    _FlappingOwner.reads = 0
    for call in (lambda: s.attempts.put(att(rid), flapping),
                 lambda: s.attempts.heartbeat(rid, "digest-1", 0, flapping, 12),
                 lambda: s.attempts.patch(rid, "digest-1", 0, flapping, meta={}),
                 lambda: s.attempts.finish(att(rid, state="done", finished_at_ms=20), flapping)):
        with pytest.raises(AttemptStoreError) as e:
            call()
        assert e.value.code == "invalid_attempt"
    assert _FlappingOwner.reads == 0
    assert s.attempts.put(att(rid), OWN) == Inserted()
    assert s.attempts.heartbeat(rid, "digest-1", 0, OWN, 12) == Updated(12)
    assert s.attempts.patch(rid, "digest-1", 0, OWN, meta={"k": 1}) == Patched()
    assert s.attempts.finish(att(rid, state="done", finished_at_ms=20), OWN) == Finished()
