"""Exactly once under crashes: a builder process SIGKILLed at random points while writers mutate runs."""

from __future__ import annotations

import random
import select
import signal
import subprocess
import threading
import time

import pytest
from sqlalchemy import text

import fencepost
from fencepost._durable import Database
from fencepost._migrations import migrate
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections import _runs
from tests.projections._counting import CountingRunsByStatus, log_metadata
from tests.projections.conftest import spawn_child, why

KILLS = 12
pytestmark = pytest.mark.usefixtures("no_child_outlives_its_test")


def _spawn(source_url: str, target_url: str) -> subprocess.Popen[str]:
    return spawn_child("tests.projections._crash_child", source_url, target_url, "7")


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"builder child did not start ({why(proc)})"


def _applications(target: Database) -> int:
    return target.read(lambda conn: conn.execute(text("SELECT COUNT(*) FROM test_projection_applications")).scalar())


def _wait_for_applications(target: Database) -> None:
    deadline = time.monotonic() + 60
    while _applications(target) == 0:
        assert time.monotonic() < deadline, "the first builder child applied nothing in 60 s"
        time.sleep(0.02)


def _full_rows(db: Database, table: str) -> dict[str, tuple]:
    def body(conn):
        rows = conn.execute(text(
            "SELECT run_id, status, flow_name, owner_host_id, owner_pid, owner_nonce, created_at_ms, started_at_ms, "
            f"finished_at_ms, cancel_requested_at_ms, cancel_acknowledged_at_ms, source, revision FROM {table}"
        ))
        return {r[0]: tuple(r[1:]) for r in rows}

    return db.read(body)


@pytest.fixture(params=["other-db", "other-backend"])
def crash_target(request: pytest.FixtureRequest, backend: str, make_db_url) -> str:
    other = "postgresql" if backend == "sqlite" else "sqlite"
    return make_db_url() if request.param == "other-db" else make_db_url(other)


def test_builder_killed_at_random_points_applies_each_change_exactly_once(db_url, crash_target, make_db_url):
    """SIGKILL a builder process 12 times (two source rotations among them, so kills land in
    shadow rebuilds too) while a writer mutates runs; after a restart and a catch-up the projection
    equals the source, equals a projection built from scratch, and no (run, source, revision) was
    ever applied twice."""
    rng = random.Random(6)
    store = fencepost.open(db_url)
    target_url = crash_target
    target = Database(target_url)
    try:
        migrate(target, ("projections",))  # creates the PostgreSQL schema too
        log_metadata.create_all(target.engine)
        ids: list[str] = []

        def seed(conn):
            for i in range(200):
                _runs.create(conn, f"seed-{i:04d}", i)
                ids.append(f"seed-{i:04d}")

        store.db.write(seed)
        stop = threading.Event()
        mutations = [0]

        def writer() -> None:
            wrng = random.Random(60)
            t = 1000
            while not stop.is_set():
                t += 1
                store.db.write(lambda conn, t=t: _runs.random_mutation(conn, wrng, ids, "w", t))
                mutations[0] += 1
                time.sleep(0.004)

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            # Each successor is started as soon as its predecessor is ready, so its interpreter start
            # overlaps; it waits on the builder lock and reports ``ready`` once the kill frees it.
            proc = _spawn(db_url, target_url)
            _wait_ready(proc)
            for kill in range(KILLS):
                if kill in (4, 8):
                    store.feed.rotate_source()
                successor = _spawn(db_url, target_url) if kill < KILLS - 1 else None
                if kill == 0:
                    _wait_for_applications(target)  # a loaded machine must not kill before any page
                time.sleep(rng.uniform(0.0, 0.3))
                if successor is not None:
                    # The successor must still be waiting on the builder lock: two builders with
                    # one name on one target never apply at the same time.
                    early = select.select([successor.stdout], [], [], 0)[0]
                    assert early == [], f"successor reported before the kill ({why(successor)})"
                assert proc.poll() is None, f"builder child stopped on its own ({why(proc)})"
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                proc.stderr.close()
                proc.stdout.close()
                if successor is not None:
                    proc = successor
                    _wait_ready(proc)
        finally:
            stop.set()
            thread.join()
        assert mutations[0] > 50
        assert _applications(target) > 0  # the killed builders did commit pages between kills

        with ProjectionBuilder(store, target, CountingRunsByStatus(), lock_timeout=60) as builder:
            builder.catch_up()
            status = builder.status()
        assert status.lag == 0
        assert status.rebuilds >= 1  # at least one rotation was rebuilt (both, unless a kill hit the swap txn)
        assert status.source == store.feed.position().source

        projected = target.read(_runs.projected_rows_fn("test_counting_runs"))
        assert projected == store.db.read(_runs.live_rows)

        fresh_url = make_db_url()
        with ProjectionBuilder(store, fresh_url, RunsByStatus()) as fresh:
            fresh.catch_up()
            scratch = _full_rows(fresh.target, "projection_runs_by_status")
        assert _full_rows(target, "test_counting_runs") == scratch

        def duplicates(conn):
            return conn.execute(text(
                "SELECT run_id, source, revision, COUNT(*) FROM test_projection_applications "
                "GROUP BY run_id, source, revision HAVING COUNT(*) > 1"
            )).all()

        assert target.read(duplicates) == []
        applied = target.read(lambda conn: conn.execute(
            text("SELECT COUNT(*) FROM test_projection_applications")).scalar())
        assert applied == status.applied  # every counted application is in the log, once
    finally:
        target.dispose()
        store.close()
