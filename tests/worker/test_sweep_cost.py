"""A worker's sweep for claimable runs reads about as many rows as it can take, however many runs
have settled.

Defect: the sweep's one statement asked for claimable, expired or stale-claimed runs with one
``OR``, and its last branch (a claim older than the cutoff, on a run of any status) had no index,
so every sweep of every worker read the whole runs table: with 80,000 settled runs a sweep took
15 ms on SQLite and 30 ms on PostgreSQL, and it kept growing with the table.

Measured without a clock: the sweep's statements are captured as they run, then run again, on
SQLite counting the virtual machine instructions they execute (a store with 200 settled runs
against one with 2,200), on PostgreSQL with ``EXPLAIN ANALYZE`` counting the rows each plan node
produced, with autovacuum off for the table so its statistics stay as a busy table's would.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

import fencepost
from fencepost.journal import OwnerId
from fencepost.runstore.rows import RunSnapshot
from fencepost.worker import Worker
from tests.conftest import pg_rows_read, replayed_instructions, settle_many

LIMIT = 16
PENDING = RunSnapshot("pending", None, None)
STALE = 10**9  # far past every lease and claim cutoff


def _mixed(store: fencepost.Store) -> None:
    """A few runs of every kind the sweep looks for, and some it must leave alone."""
    for i in range(5):
        store.runs.create(f"pending-{i}", "{}")
    claimant = OwnerId("host-claim", 7, "claim-nonce")
    owner = OwnerId("host-own", 8, "own-nonce")
    store.runs.create("claimed-stale", "{}")
    store.runs.claim("claimed-stale", PENDING, claimant, 0)  # long before the clock's reading
    store.runs.create("running-live", "{}")
    store.runs.claim_and_own("running-live", PENDING, owner, STALE)


def _captured(store: fencepost.Store, worker: Worker) -> tuple[list[tuple[str, Any]], list[str]]:
    """The statements one sweep ran (with their parameters), and the run ids it found."""
    seen: list[tuple[str, Any]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _many) -> None:
        if "flows_runs" in statement and statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, parameters))

    event.listen(store.db.engine, "before_cursor_execute", capture)
    try:
        found = worker._candidates(LIMIT)
    finally:
        event.remove(store.db.engine, "before_cursor_execute", capture)
    assert seen, "the sweep ran no statement on flows_runs"
    return seen, [c["run_id"] for c in found]


@pytest.fixture
def worker(store: fencepost.Store) -> Worker:
    return Worker(store, lambda ctx: None, owner=OwnerId("host-sweep", 9, "sweep-nonce"))


def test_a_sweep_reads_what_it_can_take_not_every_settled_run(store: fencepost.Store, backend: str,
                                                              worker: Worker) -> None:
    store.clock.set(STALE)
    if backend == "postgresql":
        store.db.write(lambda conn: conn.exec_driver_sql(
            "ALTER TABLE flows_runs SET (autovacuum_enabled = off)"))
    settle_many(store, 0, 200)
    _mixed(store)
    statements, found = _captured(store, worker)
    assert set(found) == {*(f"pending-{i}" for i in range(5)), "claimed-stale"}, found
    if backend == "sqlite":
        few = replayed_instructions(store, statements)
        settle_many(store, 200, 2000)
        statements, found_later = _captured(store, worker)
        many = replayed_instructions(store, statements)
        assert found_later == found
        assert many <= few * 1.5, (few, many)
    else:
        settle_many(store, 200, 2000)
        statements, found_later = _captured(store, worker)
        assert found_later == found
        read = pg_rows_read(store, statements)
        assert read <= 8 * LIMIT, read
