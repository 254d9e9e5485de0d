"""A read whose connection is lost at its COMMIT is a failed read, retried, never "may have committed".

Defect (found by a fault hunt, PostgreSQL): a read transaction whose backend was terminated while
its COMMIT was on its way raised ``CommitUnknown``'s failure, "COMMIT got no definite answer ... so
the write may have committed: check before repeating it", although a read writes nothing, and it was
not retried: a projection builder's one-shot ``catch_up`` and any ``store.runs.get`` surfaced it to
the caller. A read's COMMIT failing is now a read failing: retried while the failure is transient,
like any lost connection during a read. The fault is real: the read connection's backend is
terminated from another connection just before the COMMIT is sent. (A SQLite read has no connection
to lose: its COMMIT of a read cannot fail this way.)
"""

from __future__ import annotations

import pytest
from sqlalchemy import event

import fencepost
from tests.faults.test_writer_pg_terminate import _terminate_and_wait


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_read_whose_connection_is_lost_at_commit_is_retried_not_called_a_possible_write(db_url):
    store = fencepost.open(db_url)
    try:
        store.runs.create("r1", '{"n": 1}')
        terminated: list[int] = []

        def before_commit(conn) -> None:
            if terminated or conn.get_execution_options().get("fencepost_write"):
                return
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            terminated.append(pid)
            _terminate_and_wait(store, pid)

        event.listen(store.db.engine, "commit", before_commit)
        try:
            row = store.runs.get("r1")
        finally:
            event.remove(store.db.engine, "commit", before_commit)
        assert terminated, "the read's COMMIT was never reached"
        assert row is not None and row.run_id == "r1" and row.state_json == '{"n": 1}'
        # The store goes on reading and writing on new connections.
        store.runs.create("r2", "{}")
        assert store.runs.get("r2") is not None
    finally:
        store.close()
