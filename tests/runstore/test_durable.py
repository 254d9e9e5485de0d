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
