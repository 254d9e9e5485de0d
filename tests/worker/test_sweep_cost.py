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

import itertools
import threading
import time
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


def test_a_following_worker_looks_for_stale_leases_once_a_second_not_at_every_sweep(
        store: fencepost.Store, worker: Worker) -> None:
    """An idle ``run()`` sweeps every 0.1 s. Its query for ``running`` runs whose lease went stale
    (30 s without a heartbeat) cannot stop early when no lease is stale, the usual case: no index
    holds the heartbeat (one would be rewritten at every heartbeat, and on PostgreSQL would make
    every heartbeat a full row update instead of a HOT one), so it read every running run, ten times
    a second per idle worker (5,000 running runs: 25,000 SQLite instructions, 10,000 PostgreSQL
    rows, each sweep). Staleness moves in seconds: the following loop now asks at most once a
    second, the other kinds of candidate at every sweep; ``take()`` asks every time."""
    owner = OwnerId("host-busy", 3, "busy-nonce")
    store.runs.create("running-fresh", "{}")
    store.runs.claim_and_own("running-fresh", PENDING, owner, store.clock.now_ms())
    looks: list[tuple[str, float]] = []

    def capture(_conn, _cursor, statement, parameters, *_args) -> None:
        if "FROM flows_runs" in statement and statement.lstrip().upper().startswith("SELECT"):
            values = parameters.values() if isinstance(parameters, dict) else parameters
            if "heartbeat_at_ms <" in statement:
                looks.append(("stale", time.monotonic()))
            elif "pending" in values:
                looks.append(("pending", time.monotonic()))

    def count(kind: str) -> int:
        return sum(1 for k, _ in looks if k == kind)

    # When each sweep decided to look: the statement itself may run a while later on a loaded
    # machine (CI saw two stale looks' statements 0.46 s apart, one sweep delayed by the scheduler),
    # so the pacing is measured where the sweep reads its clock, and the statements are counted.
    decided: list[float] = []
    candidates = worker._candidates

    def timed_candidates(limit: int, **kwargs: Any) -> list[dict[str, Any]]:
        if kwargs.get("stale_running", True) and not kwargs.get("include_live", False):
            decided.append(time.monotonic())
        return candidates(limit, **kwargs)

    worker._candidates = timed_candidates  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, kwargs={"stop": stop})
    event.listen(store.db.engine, "before_cursor_execute", capture)
    try:
        thread.start()
        _wait_for(lambda: count("stale") >= 3)
        stop.set()
        thread.join(30)
        stale = count("stale")
        sweeps = count("pending")
        assert stale == len(decided), (stale, decided)  # a stale look is asked only when decided
        # A second apart, give or take the moment between reading the clock and the call.
        assert all(later - earlier >= 0.95 for earlier, later in itertools.pairwise(decided)), decided
        assert sweeps > stale, (sweeps, stale)  # the other kinds are still asked every sweep
        before = count("stale")
        assert worker.take(1) == [] and count("stale") == before + 1  # take() always asks
    finally:
        stop.set()
        thread.join(30)
        event.remove(store.db.engine, "before_cursor_execute", capture)
    assert not thread.is_alive()


def _wait_for(condition: Any, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the worker did not sweep"
        time.sleep(0.02)
