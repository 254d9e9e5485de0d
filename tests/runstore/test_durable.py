"""Store writes inside the durable writer: nesting, whole-transaction retry, commit-time effects (A9)."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from sqlalchemy.exc import DBAPIError

from fencepost import RunStoreError, Transitioned
from fencepost.runstore import _sql as q

from .conftest import PENDING, A, count, fresh
from .test_metrics import Delta, key


def _transient(store):
    """A driver error the backend classifies as transient (busy / serialization failure)."""
    if store.db.name == "sqlite":
        orig = sqlite3.OperationalError("database is locked")
        orig.sqlite_errorname = "SQLITE_BUSY"
        return DBAPIError.instance(None, None, orig, sqlite3.Error)
    return DBAPIError.instance(None, None, psycopg.errors.SerializationFailure("conflict"), psycopg.Error)


@pytest.fixture
def fail_once(monkeypatch):
    """Make the first execution of a chosen statement raise a transient error, once."""
    def arm(store, statement):
        real = q.run
        state = {"armed": True}

        def run(conn, stmt, params):
            if stmt is statement and state["armed"]:
                state["armed"] = False
                raise _transient(store)
            return real(conn, stmt, params)

        monkeypatch.setattr(q, "run", run)
    return arm


def test_transient_failure_retries_the_whole_outer_transaction(mstore, fail_once):
    """DW-01: a busy error on the nested create re-runs the outer body; its first attempt left nothing."""
    witness, nested = fresh("witness"), fresh("nested")
    calls = []

    def body(conn):
        calls.append(1)
        mstore.runs.create(f"{witness}-{len(calls)}", "{}")  # a write of the outer body itself
        if len(calls) == 1:
            fail_once(mstore, q.INSERT_RUN)
        mstore.runs.create(nested, "{}")
        return len(calls)

    assert mstore.db.write(body) == 2
    assert mstore.runs.get(nested).status == "pending"
    assert [r.run_id for r in mstore.runs.lineage(f"{witness}-2")] == [f"{witness}-2"]
    with pytest.raises(RunStoreError):
        mstore.runs.get(f"{witness}-1")  # the first attempt's witness rolled back


def test_transient_failure_on_a_nested_attempt_put_retries_the_outer_transaction(mstore, fail_once):
    """DW-02: one busy error on the first INSERT into flows_attempts inside an outer write: the outer
    body runs twice and succeeds; only the second attempt's witness is kept; the attempt is stored
    (running)."""
    from fencepost import Attempt, Inserted

    witness, r = fresh("witness"), fresh("dw02")
    mstore.runs.create(r, "{}")
    mstore.runs.claim_and_own(r, PENDING, A, mstore.clock.now_ms())
    attempt = Attempt(run_id=r, step_key_digest="digest-1", attempt=0, state="running", started_at_ms=10)
    calls, receipts = [], []

    def body(conn):
        calls.append(1)
        mstore.runs.create(f"{witness}-{len(calls)}", "{}")  # a write of the outer body itself
        if len(calls) == 1:
            fail_once(mstore, q.INSERT_ATTEMPT_FENCED)
        receipts.append(mstore.attempts.put(attempt, A))
        return len(calls)

    assert mstore.db.write(body) == 2
    assert receipts == [Inserted()]  # the first put never returned
    assert mstore.attempts.get(r, "digest-1", 0) == attempt
    assert mstore.attempts.get(r, "digest-1", 0).state == "running"
    assert mstore.runs.get(f"{witness}-2").status == "pending"
    with pytest.raises(RunStoreError):
        mstore.runs.get(f"{witness}-1")  # the first attempt's witness rolled back


def test_retried_settle_counts_throughput_once(otel, mstore, fail_once):
    """DW-06: a terminal transition retried once commits once and counts once."""
    r = fresh()
    mstore.runs.create(r, "{}")
    mstore.runs.claim_and_own(r, PENDING, A, mstore.clock.now_ms())
    d = Delta(otel, [key("flows_run_throughput")])
    events_before = count(mstore, "flows_journal_events")
    fail_once(mstore, q.TRANSITION_SETTLE)
    assert mstore.runs.transition_owned(r, A, "completed") == Transitioned()
    assert list(d().values()) == [1]
    assert count(mstore, "flows_journal_events") == events_before + 1  # one released fact, not two
    assert mstore.runs.get(r).status == "completed"


def test_store_error_inside_outer_write_rolls_everything_back(mstore):
    """A RunStoreError raised inside an outer write propagates and rolls back the outer writes too."""
    a, b = fresh(), fresh()

    def body(conn):
        mstore.runs.create(a, "{}")
        mstore.runs.create(b, "not-json")

    with pytest.raises(RunStoreError):
        mstore.db.write(body)
    with pytest.raises(RunStoreError) as e:
        mstore.runs.get(a)
    assert e.value.code == "not_found_row"


SECRET = "sk-live-DW03-SECRETSECRET"


def _failing_driver(store, kind):
    """A driver error of ``kind`` (busy or io) whose message and cause both hold SECRET."""
    if store.db.name == "sqlite":
        orig = sqlite3.OperationalError(f"database is locked near {SECRET}" if kind == "busy"
                                        else f"disk I/O error reading {SECRET}")
        orig.sqlite_errorname = "SQLITE_BUSY" if kind == "busy" else "SQLITE_IOERR"
        base = sqlite3.Error
    else:
        orig = (psycopg.errors.SerializationFailure(f"could not serialize {SECRET}") if kind == "busy"
                else psycopg.errors.IoError(f"could not read {SECRET}"))
        base = psycopg.Error
    orig.__cause__ = RuntimeError(SECRET)
    return DBAPIError.instance(f"INSERT ... '{SECRET}'", {"v": SECRET}, orig, base)


@pytest.mark.parametrize("kind", ["busy", "io"])
def test_writer_failures_carry_category_and_code_but_no_secret(mstore, monkeypatch, kind):
    """DW-03/04: the writer fails with a busy (retried until the attempts run out) or an I/O error
    whose text and cause hold a secret: the RunStoreError is ``persistence_failed`` with cause
    ``{category, code}`` and the driver's code; the secret is in no message, cause or chain."""
    from fencepost import _durable

    monkeypatch.setattr(_durable, "MAX_ATTEMPTS", 2)  # a busy database is retried: keep it short
    real = q.run

    def run(conn, stmt, params):
        if stmt is q.INSERT_RUN:
            raise _failing_driver(mstore, kind)
        return real(conn, stmt, params)

    monkeypatch.setattr(q, "run", run)
    rid = fresh()
    with pytest.raises(RunStoreError) as e:
        mstore.runs.create(rid, "{}")
    err = e.value
    assert err.code == "persistence_failed"
    assert err.cause == {"category": "persistence_failed", "code": err.db_code} and err.db_code
    seen, link = [], err
    while link is not None:
        seen.append(f"{link!s} {link!r} {getattr(link, 'cause', '')!r}")
        link = link.__cause__ or link.__context__
    assert SECRET not in " ".join(seen)
    monkeypatch.setattr(q, "run", real)
    with pytest.raises(RunStoreError):
        mstore.runs.get(rid)  # nothing was written
