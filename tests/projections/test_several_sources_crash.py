"""Exactly once per source under crashes: a builder fed by two SQLite stores and one PostgreSQL schema
is SIGKILLed repeatedly while writers mutate all three and one of them rotates its source."""

from __future__ import annotations

import random
import signal
import subprocess
import time

import pytest
from sqlalchemy import text

from fencepost._durable import Database
from fencepost._migrations import migrate
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections._several import (
    CountingShares,
    Writers,
    log_metadata,
    open_sources,
    projected_by_source,
    rows_by_source,
    seed,
    store_rows,
)
from tests.projections.conftest import spawn_child, why

KILLS = 5
ROTATE_AT = 2  # the kill before which ``edge-2`` rotates its source
pytestmark = pytest.mark.usefixtures("no_child_outlives_its_test")


def _spawn(target_url: str, urls: dict[str, str], *, hang_in_rebuild: bool = False) -> subprocess.Popen[str]:
    """A builder child; ``hang_in_rebuild``: it stops inside its second shadow page until killed."""
    return spawn_child("tests.projections._several_crash_child", target_url, "7",
                       *(["hang-in-rebuild"] if hang_in_rebuild else []),
                       *(f"{name}={url}" for name, url in urls.items()))


def _wait_for(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == word, f"builder child did not report {word} ({why(proc)})"


def _count(target: Database, where: str = "") -> int:
    sql = text(f"SELECT COUNT(*) FROM test_share_applications {where}")
    return target.read(lambda conn: conn.execute(sql).scalar())


def _shares_started(target: Database) -> int:
    sql = text("SELECT COUNT(*) FROM projection_checkpoints WHERE projection = 'counting_shares' AND revision > 0")
    return target.read(lambda conn: conn.execute(sql).scalar())


def _rebuilding(target: Database, checkpoint: str) -> bool:
    sql = text("SELECT shadow_source IS NOT NULL FROM projection_checkpoints WHERE name = :name")
    return bool(target.read(lambda conn: conn.execute(sql, {"name": checkpoint}).scalar()))


def test_builder_of_several_sources_killed_repeatedly_applies_each_change_once_per_source(make_db_url):
    """SIGKILL the builder process ``KILLS`` times (each successor waits on the builder lock) while
    writers mutate all three stores. ``edge-2`` rotates its source before kill ``ROTATE_AT``, which
    lands inside edge-2's shadow rebuild; a successor resumes it. Afterwards each source's rows
    equal its store and a read model built from scratch; only edge-2 was rebuilt and no other
    source's share ever wrote a shadow row; and no (source name, source id, run, revision) was
    applied twice."""
    rng = random.Random(14)
    urls, stores = open_sources(make_db_url)
    target_url = make_db_url()
    target = Database(target_url)
    try:
        migrate(target, ("projections",))  # creates the PostgreSQL schema too
        log_metadata.create_all(target.engine)
        ids = {name: [] for name in stores}
        for name, store in stores.items():
            seed(store, ids[name], "seed", 80)
        killed_mid_rebuild = False
        with Writers(stores, ids, pause=0.02) as writers:
            proc = _spawn(target_url, urls, hang_in_rebuild=ROTATE_AT == 0)
            _wait_for(proc, "started")
            _wait_for(proc, "ready")
            deadline = time.monotonic() + 60
            while _shares_started(target) < len(stores):  # so the rotation is a rebuild, not a first build
                assert time.monotonic() < deadline, "the first builder child did not reach every source in 60 s"
                time.sleep(0.02)
            for kill in range(KILLS):
                # The successor starts while its predecessor works, and waits on the builder lock:
                # two builders of one name on one target never apply at the same time.
                # The builder that is running at kill ROTATE_AT stops inside edge-2's rebuild once
                # its first shadow page is committed: the kill lands there however slow this
                # process is to send it (a rebuild left to run finished first on a loaded machine).
                successor = (_spawn(target_url, urls, hang_in_rebuild=kill + 1 == ROTATE_AT)
                             if kill < KILLS - 1 else None)
                if successor is not None:
                    _wait_for(successor, "started")
                if kill == ROTATE_AT:
                    stores["edge-2"].feed.rotate_source()
                    deadline = time.monotonic() + 60
                    while _count(target, "WHERE shadow = 1") == 0:  # its first shadow page committed
                        assert time.monotonic() < deadline, "edge-2's rebuild did not start in 60 s"
                        time.sleep(0.01)
                else:
                    time.sleep(rng.uniform(0.0, 0.4))
                assert proc.poll() is None, f"builder child stopped on its own ({why(proc)})"
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                proc.stderr.close()
                proc.stdout.close()
                if kill == ROTATE_AT:
                    killed_mid_rebuild = _rebuilding(target, "counting_shares@edge-2")
                if successor is not None:
                    proc = successor
                    _wait_for(proc, "ready")
        assert killed_mid_rebuild, "the kill after the rotation did not land inside edge-2's rebuild"
        assert all(count > 20 for count in writers.counts.values())

        with ProjectionBuilder(stores, target, CountingShares(), lock_timeout=60) as builder:
            builder.catch_up()
            status = builder.status()
        assert all(st.lag == 0 and st.pending_rebuild is None for st in status.values())
        assert {name: st.rebuilds for name, st in status.items()} == {"edge-1": 0, "edge-2": 1, "central": 0}
        assert {name: st.source for name, st in status.items()} == {
            name: store.feed.position().source for name, store in stores.items()}
        assert _count(target, "WHERE shadow = 1 AND source_name <> 'edge-2'") == 0
        assert projected_by_source(target, "test_counting_shares", list(stores)) == store_rows(stores)

        with ProjectionBuilder(stores, make_db_url(), RunsByStatus()) as fresh:
            fresh.catch_up()
            scratch = rows_by_source(fresh.target, "projection_runs_by_status")
        assert rows_by_source(target, "test_counting_shares") == scratch

        duplicates = target.read(lambda conn: conn.execute(text(
            "SELECT source_name, source, run_id, revision, COUNT(*) FROM test_share_applications "
            "GROUP BY source_name, source, run_id, revision HAVING COUNT(*) > 1")).all())
        assert duplicates == []
        assert _count(target) == sum(st.applied for st in status.values())  # each counted application, once
    finally:
        target.dispose()
        for store in stores.values():
            store.close()
