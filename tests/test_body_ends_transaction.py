"""A callback handed a connection inside fencepost's transaction cannot end that transaction.

Defect (found by a review, both backends): ``store.db.write(fn)`` (and a projection's ``apply``,
handed ``target.conn``) whose ``fn`` called ``conn.commit()`` committed the first part of its work
on the spot, without the rest of the transaction: on PostgreSQL the write lock (released at that
COMMIT) no longer covered the statements after it, which then committed too; a projection's rows
committed without their checkpoint and were applied a second time by the next builder. Worse, the
transaction SQLAlchemy began for the statements after it stayed on the kept connection, so every
later write of the store failed with a bare ``persistence_failed`` for the rest of the process.

Now ``commit()``, ``rollback()`` and ``close()`` on such a connection raise at once, naming the
call; the transaction is rolled back whole (nothing of the callback is committed) and the next
call works.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost._durable import DbFailure

ENDS = ["commit", "rollback", "close"]


def _body(method: str):
    def body(conn) -> None:
        conn.exec_driver_sql("UPDATE flows_runs SET cancel_requested_at_ms = 1 WHERE run_id = 'a'")
        getattr(conn, method)()
        conn.exec_driver_sql("DELETE FROM flows_runs WHERE run_id = 'a'")

    return body


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
@pytest.mark.parametrize("method", ENDS)
def test_a_write_body_that_ends_its_transaction_is_refused_and_commits_nothing(
        store: fencepost.Store, method: str) -> None:
    store.runs.create("a", "{}")
    before = store.feed.position().revision
    with pytest.raises(DbFailure) as caught:
        store.db.write(_body(method))
    err = caught.value
    assert err.category == "persistence_failed" and not err.transient, repr(err)
    assert f"conn.{method}()" in str(err.reason) and "nothing of it was committed" in str(err.reason)
    row = store.runs.get("a")
    assert row.cancel_requested_at_ms is None  # the UPDATE before the call did not commit
    assert store.feed.position().revision == before
    # The same store goes on: reads, writes, and a write through the same kept connection.
    store.runs.create("b", "{}")
    assert store.db.write(lambda conn: conn.exec_driver_sql("SELECT 1").scalar()) == 1
    assert store.runs.get("b").status == "pending"


@pytest.mark.parametrize("method", ENDS)
def test_a_read_body_that_ends_its_transaction_is_refused(store: fencepost.Store, method: str) -> None:
    store.runs.create("a", "{}")

    def body(conn) -> int:
        conn.exec_driver_sql("SELECT 1")
        getattr(conn, method)()
        return 1

    with pytest.raises(DbFailure) as caught:
        store.db.read(body)
    assert f"conn.{method}()" in str(caught.value.reason)
    assert store.runs.get("a").status == "pending"
    store.runs.create("b", "{}")


def test_a_nested_write_body_that_commits_commits_nothing_of_the_outer_one(store: fencepost.Store) -> None:
    store.runs.create("a", "{}")

    def outer(conn) -> None:
        conn.exec_driver_sql("UPDATE flows_runs SET cancel_requested_at_ms = 2 WHERE run_id = 'a'")
        store.db.write(_body("commit"))

    with pytest.raises(DbFailure):
        store.db.write(outer)
    assert store.runs.get("a").cancel_requested_at_ms is None
    store.runs.create("b", "{}")
