"""A PostgreSQL server restarted (a private ``initdb`` instance, never the shared one) in the middle
of operations no other fault test restarts it under. Each test's docstring names its pair.

The restart is ``pg_ctl restart -m fast``: every session ends, the server is away about half a
second, then accepts again. What was in flight must be all there or not at all, and the SAME
objects (store, builder) work on without being opened again.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

import fencepost
from fencepost.journal import NewEntry, verify
from fencepost.journal.verify import head
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.faults.conftest import assert_value_free

pytestmark = pytest.mark.slow


def test_restart_mid_group_commit_runs_every_member_once(private_server) -> None:
    """Server restart x group commit with several threads. Four calls share one transaction; the
    server restarts inside the third member's body (its next statement meets the dead session: the
    outcome is known, nothing committed). Every call then runs again alone, each lands exactly once,
    and the same store's next shared group commits."""
    from tests.test_group_commit import _call_all, _hold_until_queued, _run_ids

    store = fencepost.open(private_server.url)
    try:
        store.runs.create("before", "{}")
        since = store.feed.position()
        attempts: dict[str, int] = {}

        def insert(run_id: str, restart: bool = False):
            def body(conn):
                attempts[run_id] = attempts.get(run_id, 0) + 1
                conn.execute(text("INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) "
                                  "VALUES (:r, 'pending', '{}', 0)"), {"r": run_id})
                if restart and attempts[run_id] == 1:
                    private_server.restart()
                    conn.execute(text("SELECT 1"))
                return run_id
            return body

        outcomes = _call_all(store, _hold_until_queued(store, 3),
                             {"m0": insert("m0"), "m1": insert("m1"), "m2": insert("m2", restart=True)})
        assert outcomes == {"leader": "leader", "m0": "m0", "m1": "m1", "m2": "m2"}, outcomes
        assert attempts["m2"] == 2
        assert _run_ids(store) == {"before", "leader", "m0", "m1", "m2"}
        changed = sorted(c.run_id for c in store.feed.changes_since(since, limit=100).changes)
        assert changed == ["leader", "m0", "m1", "m2"]  # each once, no gap
        store.db.write(lambda conn: conn.execute(text("DELETE FROM flows_runs WHERE run_id = 'leader'")))
        outcomes = _call_all(store, _hold_until_queued(store, 2), {"n0": insert("n0"), "n1": insert("n1")})
        assert outcomes == {"leader": "leader", "n0": "n0", "n1": "n1"}, outcomes  # the same store, shared again
    finally:
        store.close()


def test_restart_mid_verify_reports_the_journal_intact(private_server, monkeypatch) -> None:
    """Server restart x journal verify (the connection-drop test terminates one backend; here the
    whole server goes away for a while). ``verify`` reads page by page; the server restarts after
    the first page. The same call goes on (its read is retried from the start), reports no false
    break, and the store appends and verifies again."""
    import sys

    store = fencepost.open(private_server.url)
    try:
        store.journal.append_many_unfenced("run", [NewEntry("step", {"i": i}) for i in range(12)], source_id="w")
        monkeypatch.setattr(sys.modules["fencepost.journal.verify"], "PAGE", 5)
        restarted: list[int] = []

        def restart_after_first_page(conn, cursor, statement, params, context, executemany) -> None:
            if not restarted and "FROM flows_journal_events" in statement and "LIMIT" in statement.upper():
                restarted.append(1)
                private_server.restart()

        from sqlalchemy import event

        event.listen(store.db.engine, "after_cursor_execute", restart_after_first_page)
        try:
            report = verify(store)
        finally:
            event.remove(store.db.engine, "after_cursor_execute", restart_after_first_page)
        assert restarted, "the fault was never injected"
        assert report.ok and (report.entries_checked, report.breaks) == (12, 0), report
        assert report.head == head(store)
        store.journal.append_many_unfenced("run", [NewEntry("step", {"i": 12})], source_id="w")
        assert verify(store).entries_checked == 13
    finally:
        store.close()


def test_restart_mid_projection_build_then_the_same_builder_catches_up(private_server) -> None:
    """Server restart x projection build (source and target on the restarted server). The server
    restarts after the builder committed its first page. The catch-up either rides it out or fails
    as a transient ``ProjectionError`` with nothing of the failed page applied; the same builder then
    finishes, and its projection equals one built afresh."""
    store = fencepost.open(private_server.url)
    try:
        store.journal.transact(lambda tx: [store.runs.create(f"run-{i:03d}", "{}") for i in range(60)])
        target = private_server.url.replace("schema=fencepost", "schema=proj")
        fresh = private_server.url.replace("schema=fencepost", "schema=fresh")
        with ProjectionBuilder(store, target, RunsByStatus(), batch_size=10) as builder:
            pages: list[int] = []

            def restart_after_first(shadow, page) -> None:
                pages.append(page.next_revision)
                if len(pages) == 1:
                    private_server.restart()

            builder._after_page = restart_after_first
            try:
                done = builder.catch_up()
            except fencepost.ProjectionError as exc:
                assert exc.transient is True, exc  # type: ignore[attr-defined]
                assert_value_free(exc)
                done = None
            builder._after_page = None
            print(f"\nFAULT-REPORT | server restart mid projection build | postgresql | "
                  f"{'ridden out' if done else 'transient ProjectionError'} | -")
            status = builder.status()
            assert status.applied_revision in pages, (status, pages)  # a page boundary: nothing partial
            after = builder.catch_up()
            assert builder.status().lag == 0
            total = (done.applied if done else 0) + after.applied
            assert builder.status().applied == 60 and total <= 60, (done, after)
            with ProjectionBuilder(store, fresh, RunsByStatus()) as other:
                other.catch_up()

            def rows(url):
                from fencepost._durable import Database

                db = Database(url, readonly=True)
                try:
                    return db.read(lambda c: c.execute(text(
                        "SELECT run_id, status, source, revision FROM projection_runs_by_status ORDER BY run_id"
                    )).all())
                finally:
                    db.dispose()

            assert rows(target) == rows(fresh) and len(rows(target)) == 60
    finally:
        store.close()


def test_server_down_under_the_worker_heartbeats_then_the_same_leases_are_renewed(private_server) -> None:
    """Server stop/start x worker heartbeat loop (the outage tests stop the server under a sweep
    and under a checkpoint; here only the heartbeats of runs in hand meet it). Three runs are in
    hand, their functions busy without touching the store, while the server is down about two
    seconds: pulses meet it (each fails, or waits it out within its write budget), then renew the
    same leases; every run completes once, none lost or retaken."""
    import threading
    from collections import Counter

    from fencepost.worker import Worker

    store = fencepost.open(private_server.url)
    try:
        runs = [f"job-{n}" for n in range(3)]
        for run_id in runs:
            store.runs.create(run_id, "{}")
        calls: Counter[str] = Counter()
        in_hand = threading.Semaphore(0)
        back = threading.Event()

        def fn(ctx):
            calls[ctx.run_id] += 1
            in_hand.release()
            assert back.wait(60)
            time.sleep(1.5)  # a pulse after the server is back
            ctx.check()  # LeaseLost had the heartbeats not carried the lease across
            return {"done": ctx.run_id}

        worker = Worker(store, fn, concurrency=3)
        result: list = []
        thread = threading.Thread(target=lambda: result.append(worker.run(until_idle=True)))
        thread.start()
        for _ in range(3):
            assert in_hand.acquire(timeout=60)
        pulses_before = worker.supervisor.pulses
        private_server._run("pg_ctl", "-D", str(private_server.data), "-m", "fast", "-w", "stop")
        time.sleep(2.5)
        private_server.start()
        sent_while_down = worker.supervisor.pulses - pulses_before
        failed_during = worker.supervisor.failed_pulses
        back.set()
        thread.join(timeout=60)
        assert not thread.is_alive() and result, "the worker did not finish"
        stats = result[0]
        assert sent_while_down > 0, "no heartbeat met the outage"  # it failed, or waited the outage out
        assert (stats.completed, stats.failed, stats.lost, stats.takeovers) == (3, 0, 0, 0), stats
        assert calls == Counter(dict.fromkeys(runs, 1))
        assert worker.supervisor.failed_pulses == failed_during  # none failed once the server was back
        for run_id in runs:
            assert store.runs.get(run_id).status == "completed"
        print(f"\nFAULT-REPORT | server down 2.5 s under heartbeats | postgresql | "
              f"{sent_while_down} pulse(s) sent while down, {failed_during} failed | -")
    finally:
        store.close()
