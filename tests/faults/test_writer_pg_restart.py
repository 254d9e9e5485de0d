"""A PostgreSQL server restarted under the writer (a private ``initdb`` instance, never the shared one).

Mid-transaction the writer retries on a new connection and applies the body once. With the server
down longer than the retry budget the caller gets ``persistence_failed``; once the server is back
the same Store writes again at once, as does another process.
"""

from __future__ import annotations

import time

import pytest

import fencepost
from tests.faults.conftest import (
    RECOVERY_BOUND_S,
    assert_nothing_of,
    assert_once,
    assert_value_free,
    composite,
    record,
)

pytestmark = pytest.mark.slow


def test_restart_mid_transaction_retries_once(private_server) -> None:
    store = fencepost.open(private_server.url)
    try:
        store.runs.create("before", "{}")
        attempts: list[int] = []

        def body(tx):
            attempts.append(1)
            store.runs.create("across", '{"step": 1}')
            tx.append_unfenced("across", "made", {"n": 1}, source_id="fault-suite")
            if len(attempts) == 1:
                private_server.restart()  # the transaction's session dies with the server
            tx.conn.exec_driver_sql("SELECT 1")

        started = time.monotonic()
        store.journal.transact(body)
        record("server restart mid-transaction", "postgresql", "nothing (retried once)", time.monotonic() - started)
        assert len(attempts) == 2
        assert_once(store, "across")
        assert store.runs.get("before").status == "pending"
    finally:
        store.close()


def test_server_down_then_back(private_server, peer) -> None:
    store = fencepost.open(private_server.url)
    try:
        store.runs.create("before", "{}")
        since = store.feed.position()
        private_server._run("pg_ctl", "-D", str(private_server.data), "-m", "fast", "-w", "stop")
        started = time.monotonic()
        with pytest.raises(fencepost.JournalError) as err:
            composite(store, "while-down")
        gave_up = time.monotonic() - started
        assert err.value.code == "sink_failed"
        assert err.value.cause_code == "persistence_failed"  # type: ignore[attr-defined]
        assert_value_free(err.value)
        assert gave_up < 30, gave_up  # the retry budget, not a hang

        private_server.start()
        back = time.monotonic()
        composite(store, "after")  # the same Store, no reopen
        recovered = time.monotonic() - back
        record("server down past the retry budget, then back", "postgresql",
               f"JournalError sink_failed/persistence_failed {err.value.db_code} after {gave_up:.1f}s", recovered)
        other = peer(private_server.url)
        assert other.write(timeout=5) < RECOVERY_BOUND_S
        assert_once(store, "after")
        assert_nothing_of(store, "while-down", since)
        assert recovered < 5, recovered
    finally:
        store.close()
