"""PostgreSQL: only a projection builder's lock session is terminated (``pg_terminate_backend``) while
its ``catch_up`` is running, and a second builder of the same name races it.

The builder's lock is a session advisory lock on a connection of its own; terminating that backend
ends the lock and nothing else (the builder's writes go through other connections). Defect: the
builder looked at its lock only when a call began, so the running catch-up went on committing pages
while the second builder held the name: two builders applying one projection at once. Now each
write of the builder first makes sure its lock is still there (taking it again when the name is
free), so here the first builder stops with ``builder_busy`` at its next page, and every page is
applied once, in order, by one builder holding the lock.

PostgreSQL only: SQLite's lock is an ``flock`` held by the builder's process, which no fault of a
database session takes away.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

import fencepost
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.conftest import run_in_background

pytestmark = pytest.mark.slow


def _lock_pid(builder: ProjectionBuilder) -> int:
    return int(builder._lock._handle.connection.dbapi_connection.info.backend_pid)


def _terminate(store: fencepost.Store, pid: int) -> None:
    def body(conn):
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar() is True
        deadline = time.monotonic() + 10
        while conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).scalar():
            assert time.monotonic() < deadline, "the lock's backend did not end"
            time.sleep(0.01)
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))  # the activity view is read once per transaction

    store.db.read(body)


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_builder_whose_lock_session_ends_mid_catch_up_stops_writing_while_another_holds_it(
        db_url: str, make_db_url) -> None:
    with fencepost.open(db_url) as store:
        store.journal.transact(lambda tx: [store.runs.create(f"run-{i:03d}", "{}") for i in range(60)])
        committed: list[tuple[str, list[str], int]] = []  # (builder, run ids of the page, next revision)
        second_holds, release = threading.Event(), threading.Event()
        first = ProjectionBuilder(store, db_url, RunsByStatus(), batch_size=10, lock_timeout=0)
        second = ProjectionBuilder(store, db_url, RunsByStatus(), batch_size=10, lock_timeout=5)
        thread = failed = None
        try:
            def first_page(shadow: bool, page) -> None:
                nonlocal thread, failed
                committed.append(("first", [u.run_id for u in page.updates], page.next_revision))
                if len(committed) == 1:
                    _terminate(store, _lock_pid(first))
                    thread, failed = run_in_background(second.catch_up)
                    assert second_holds.wait(20), f"the second builder never committed a page: {failed}"

            def second_page(shadow: bool, page) -> None:
                committed.append(("second", [u.run_id for u in page.updates], page.next_revision))
                if not second_holds.is_set():
                    second_holds.set()
                    release.wait(10)  # holding the lock, in the middle of its own catch-up

            first._after_page = first_page
            second._after_page = second_page
            try:
                first.catch_up()
            except ProjectionError as exc:
                outcome: object = exc
            else:
                outcome = "finished"
            release.set()
            assert thread is not None
            thread.join(30)
            assert not thread.is_alive() and not failed, failed
            # While the second builder held the name, the first one wrote nothing.
            assert [who for who, _, _ in committed[:2]] == ["first", "second"], committed
            assert all(who == "second" for who, _, _ in committed[1:]), committed
            assert isinstance(outcome, ProjectionError) and outcome.code == "builder_busy", outcome
            # Every page once, in order: no run applied twice, the revisions only move forward.
            ids = [run_id for _, page_ids, _ in committed for run_id in page_ids]
            assert sorted(ids) == [f"run-{i:03d}" for i in range(60)], committed
            revisions = [rev for _, _, rev in committed]
            assert revisions == sorted(set(revisions)), committed
        finally:
            release.set()
            second.close()
            first._after_page = None
        assert first.catch_up().applied == 0  # the name is free again: the same builder takes it
        first.close()
        fresh = make_db_url()
        with ProjectionBuilder(store, fresh, RunsByStatus()) as again:
            again.catch_up()

        def rows(url: str) -> list[tuple]:
            schema = url.rsplit("schema=", 1)[1]
            return store.db.read(lambda c: [tuple(r) for r in c.execute(text(
                f"SELECT run_id, status, revision FROM {schema}.projection_runs_by_status ORDER BY run_id")).all()])

        assert rows(db_url) == rows(fresh)
