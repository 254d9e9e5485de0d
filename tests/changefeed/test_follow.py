"""follow() and afollow(): wake-ups, idle cost, stopping, rotation, surviving an unavailable database."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import event, text

import fencepost
from fencepost import Change, Position, SourceChanged
from tests.changefeed import _workers
from tests.changefeed.conftest import insert_run, restore_older_copy


class Follower:
    """Run ``store.feed.follow`` in a thread, collecting what it yields."""

    def __init__(self, store: fencepost.Store, position: Position | None = None, poll_interval: float = 60.0):
        self.stop = threading.Event()
        self.changes: list[Change] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(store, position, poll_interval), daemon=True)
        self._thread.start()

    def _run(self, store, position, poll_interval) -> None:
        try:
            for change in store.feed.follow(position, stop=self.stop, poll_interval=poll_interval):
                self.changes.append(change)
        except BaseException as exc:
            self.error = exc

    def wait_for(self, predicate: Callable[[list[Change]], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.changes):
                return True
            if self.error is not None:
                raise AssertionError(f"follow() failed after {self.ids()}") from self.error
            time.sleep(0.01)
        raise AssertionError(f"follow() yielded only {self.ids()} within {timeout}s")

    def ids(self) -> list[str]:
        return [c.run_id for c in self.changes]

    def close(self, timeout: float = 5.0) -> bool:
        self.stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()


class QueryCounter:
    """Count statements issued through an engine; ``pages`` counts those that read the feed tables."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.count = 0
        self.pages = 0
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn, cursor, statement, *args) -> None:
        self.count += 1
        if "flows_run_changes" in statement or "flows_run_source" in statement:
            self.pages += 1

    def reset(self) -> None:
        self.count = self.pages = 0

    def remove(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


def _other_process_inserts(url: str, run_id: str) -> None:
    proc = multiprocessing.get_context("spawn").Process(target=_workers.insert_one, args=(url, run_id))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0


def test_follow_from_none_yields_history_then_live_changes_and_stops(store, raw):
    insert_run(raw, "a")
    insert_run(raw, "b")
    raw.commit()
    follower = Follower(store, poll_interval=60)
    try:
        assert follower.wait_for(lambda c: len(c) == 2)
        insert_run(raw, "c")
        raw.commit()
        raw.exec_driver_sql("DELETE FROM flows_runs WHERE run_id = 'a'")
        raw.commit()
        assert follower.wait_for(lambda c: len(c) == 4)
    finally:
        assert follower.close()
    assert follower.error is None
    assert [(c.run_id, c.revision, c.deleted) for c in follower.changes] == [
        ("a", 1, False), ("b", 2, False), ("c", 3, False), ("a", 4, True)
    ]


def test_follow_resumes_after_a_given_position(store, raw):
    for rid in "abc":
        insert_run(raw, rid)
    raw.commit()
    source = store.feed.position().source
    follower = Follower(store, Position(source, 2))
    try:
        assert follower.wait_for(lambda c: len(c) == 1)
        time.sleep(0.2)
    finally:
        assert follower.close()
    assert follower.ids() == ["c"]


def test_follow_wakes_on_a_commit_from_another_process_without_polling(store, db_url, idle_follower):
    """Idle, the follower issues (almost) no queries; a commit in another process wakes it at once."""
    follower = Follower(store, poll_interval=60)
    counter = QueryCounter(store.db.engine)
    try:
        idle_follower.wait()  # the initial page and, on PostgreSQL, the post-LISTEN re-query are done
        counter.reset()
        time.sleep(2.0)
        idle, idle_pages = counter.count, counter.pages
        started = time.monotonic()
        _other_process_inserts(db_url, "from-elsewhere")
        assert follower.wait_for(lambda c: len(c) == 1, timeout=10)
        woke_after = time.monotonic() - started
    finally:
        counter.remove()
        assert follower.close()
    assert follower.error is None
    assert follower.ids() == ["from-elsewhere"]
    # 2 s idle with a 60 s poll: no page query at all, and at most a few cheap confirmations of a
    # stray file event (PRAGMA data_version, SQLite); a loop polling at full speed would issue thousands.
    assert idle_pages == 0, idle
    assert idle <= 20, idle
    # The wake-up came from the commit, not from the 60 s poll (the time includes process start).
    assert woke_after < 10


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_url_option_holding_a_space_still_lets_the_follower_listen(db_url):
    """The follower's LISTEN session was opened from the store's URL rendered again as text, which
    writes a space in a query value as ``+``; libpq does not read ``+`` as a space, so
    ``options=-c statement_timeout=0`` reached the server as ``-c+statement_timeout=0`` and every
    LISTEN connection was refused, silently: the follower woke only at its poll interval. It now
    connects with the store's own connection parameters. A commit of another connection wakes a
    follower polling once a minute. (PostgreSQL only: SQLite followers watch the file.)"""
    with fencepost.open(f"{db_url}&options=-c%20statement_timeout%3D0") as store, fencepost.open(db_url) as peer:
        peer.db.write(lambda conn: insert_run(conn, "history"))
        follower = Follower(store, poll_interval=60)
        try:
            assert follower.wait_for(lambda c: [x.run_id for x in c] == ["history"])  # the first page
            peer.db.write(lambda conn: insert_run(conn, "woken"))
            assert follower.wait_for(lambda c: [x.run_id for x in c] == ["history", "woken"], timeout=10)
        finally:
            assert follower.close()


def test_commits_to_another_store_do_not_wake_the_follower(store, make_db_url, clock, idle_follower):
    """Another database beside ours (SQLite: another file in the same directory; PostgreSQL: another
    schema, same channel) takes commits: our follower issues no page query for them."""
    if store.db.name == "sqlite":
        other_url = f"sqlite:///{store.db.path.parent / 'neighbour.db'}"
    else:
        other_url = make_db_url()
    with fencepost.open(other_url, clock=clock) as other:
        follower = Follower(store, poll_interval=60)
        counter = QueryCounter(store.db.engine)
        try:
            idle_follower.wait()
            counter.reset()
            for i in range(5):
                other.db.write(lambda conn, i=i: insert_run(conn, f"elsewhere-{i}"))
                time.sleep(0.1)
            time.sleep(0.5)
        finally:
            counter.remove()
            assert follower.close()
    assert follower.error is None and follower.changes == []
    assert counter.pages == 0, counter.pages


@pytest.mark.parametrize("backend", ["sqlite"])  # file events exist only on SQLite
def test_file_noise_is_confirmed_away_without_paging(store, raw):
    """SQLite: file events that are not commits (touching the database files, writing a neighbour
    file) are confirmed with PRAGMA data_version and cost no page query."""
    insert_run(raw, "a")
    raw.commit()
    follower = Follower(store, poll_interval=60)
    seen: list[str] = []

    def spy(conn, cursor, statement, *args) -> None:
        seen.append(statement)

    try:
        assert follower.wait_for(lambda c: len(c) == 1)
        time.sleep(0.3)
        event.listen(store.db.engine, "before_cursor_execute", spy)
        for _ in range(3):
            for suffix in ("", "-wal"):
                os.utime(str(store.db.path) + suffix)
            (store.db.path.parent / "neighbour.txt").write_text(str(time.time()))
            time.sleep(0.3)
        event.remove(store.db.engine, "before_cursor_execute", spy)
    finally:
        assert follower.close()
    assert any("data_version" in s for s in seen), "the touches were not noticed at all"
    assert not [s for s in seen if "flows_run_changes" in s or "flows_run_source" in s]


def test_stop_ends_an_idle_follow_promptly(store):
    follower = Follower(store, poll_interval=60)
    time.sleep(0.3)
    started = time.monotonic()
    assert follower.close(timeout=5)
    assert time.monotonic() - started < 2
    assert follower.error is None


def test_breaking_out_of_follow_releases_it(store, raw):
    insert_run(raw, "a")
    insert_run(raw, "b")
    raw.commit()
    it = store.feed.follow(poll_interval=60)
    assert next(it).run_id == "a"
    it.close()  # what a `break` does: the generator's cleanup closes the waiter
    assert [c.run_id for c in store.feed.follow(stop=_set_after(store, 1))][:2] == ["a", "b"]


def _set_after(store, seconds: float) -> threading.Event:
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    return stop


def test_follow_raises_source_changed_when_the_source_rotates(store, raw):
    insert_run(raw, "a")
    raw.commit()
    follower = Follower(store, poll_interval=60)
    try:
        assert follower.wait_for(lambda c: len(c) == 1)
        store.feed.rotate_source()
        deadline = time.monotonic() + 10
        while follower.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        follower.close()
    assert isinstance(follower.error, SourceChanged)


def test_follow_refuses_a_malformed_position_at_once(store):
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.follow(Position("nothex", 0))
    assert err.value.code == "decode_failed"
    with pytest.raises(ValueError):
        store.feed.follow(poll_interval=0)


def test_follow_from_another_source_raises_source_changed(store):
    it = store.feed.follow(Position("0" * 32 if store.feed.position().source != "0" * 32 else "1" * 32, 0))
    with pytest.raises(SourceChanged):
        next(it)


def test_afollow_yields_changes_and_stops_on_an_asyncio_event(store, raw):
    insert_run(raw, "a")
    raw.commit()

    async def main() -> list[str]:
        stop = asyncio.Event()
        seen: list[str] = []

        async def writer() -> None:
            await asyncio.sleep(0.3)
            insert_run(raw, "b")
            raw.commit()

        task = asyncio.create_task(writer())
        async for change in store.feed.afollow(stop=stop, poll_interval=60):
            seen.append(change.run_id)
            if len(seen) == 2:
                stop.set()
        await task
        return seen

    assert asyncio.run(asyncio.wait_for(main(), 20)) == ["a", "b"]


def test_afollow_can_be_left_with_break(store, raw):
    insert_run(raw, "a")
    insert_run(raw, "b")
    raw.commit()

    async def main() -> list[str]:
        seen = []
        async for change in store.feed.afollow(poll_interval=60):
            seen.append(change.run_id)
            break
        return seen

    assert asyncio.run(asyncio.wait_for(main(), 20)) == ["a"]


def test_afollow_cancelled_while_idle_stops_its_worker(store):
    async def main() -> None:
        async def consume() -> None:
            async for _ in store.feed.afollow(poll_interval=60):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    # Only the threads this follow started count: a thread an earlier test in this process left
    # behind (its own follow still winding down) is not this one's.
    before = set(threading.enumerate())

    def followers() -> list[str]:
        return [t.name for t in threading.enumerate()
                if t not in before and t.name.startswith(("fencepost-follow", "fencepost-afollow"))]

    asyncio.run(asyncio.wait_for(main(), 20))
    # The follower's own thread winds down beside the loop (it never blocks it): wait for it, bounded.
    deadline = time.monotonic() + 3
    while followers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not followers()


# ------------------------------------------------------------------ an unavailable database
# PostgreSQL only: both backends run test_follow_survives_reads_failing_for_a_while.
@pytest.mark.parametrize("backend", ["postgresql"])
def test_follow_resumes_after_its_postgresql_connections_are_killed(store, db_url):
    """Simulated server restart: every backend of the follower (pool and LISTEN connection) is
    terminated with pg_terminate_backend from another connection (the shared server is not restarted,
    other suites use it). Commits made meanwhile and afterwards are all delivered, once, in order."""
    pids: set[int] = set()
    event.listen(store.db.engine, "connect", lambda dbapi, _rec: pids.add(dbapi.info.backend_pid))
    store.db.engine.dispose()  # every connection the follower uses from now on is recorded
    with fencepost.open(db_url) as peer:
        def commit(run_id: str) -> None:
            peer.db.write(lambda conn: insert_run(conn, run_id))

        commit("before")
        follower = Follower(store, poll_interval=60)
        try:
            assert follower.wait_for(lambda c: c and c[-1].run_id == "before")
            app = f"fencepost-follow-{store.db.schema}"[:63]

            def kill() -> int:
                def body(conn):
                    listener = [r[0] for r in conn.execute(
                        text("SELECT pid FROM pg_stat_activity WHERE application_name = :a"), {"a": app})]
                    victims = sorted(pids | set(listener))
                    conn.execute(text("SELECT pg_terminate_backend(pid) FROM unnest(CAST(:p AS int[])) AS pid"),
                                 {"p": victims})
                    return len(listener)

                return peer.db.write(body)

            def listening() -> bool:
                return bool(peer.db.read(lambda conn: conn.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"), {"a": app}
                ).scalar()))

            def listener_up() -> None:
                # The listener connects on a thread of its own, beside the follower's reads: a
                # loaded machine delivers a change before the listener is (back) up. Wait for it.
                deadline = time.monotonic() + 20
                while not listening() and time.monotonic() < deadline:
                    time.sleep(0.05)

            listener_up()
            assert kill() == 1
            commit("during")  # sent while the listener is gone: its NOTIFY is lost
            assert follower.wait_for(lambda c: c[-1].run_id == "during", timeout=20)
            listener_up()
            assert kill() == 1  # the listener came back
            time.sleep(0.3)
            commit("after")
            assert follower.wait_for(lambda c: c[-1].run_id == "after", timeout=20)
        finally:
            assert follower.close()
    assert follower.error is None
    assert follower.ids() == ["before", "during", "after"]


def test_follow_survives_reads_failing_for_a_while(store, raw, monkeypatch):
    """Fault injection at the database boundary (both backends): for 1.5 s every read fails as a
    persistence failure (what a busy SQLite file or a restarting server looks like once the durable
    writer's own retries are spent). The follower backs off, keeps its place and then delivers the
    commit made meanwhile, once."""
    from fencepost._durable import DbFailure

    insert_run(raw, "a")
    raw.commit()
    follower = Follower(store, poll_interval=0.2)
    real_read = store.db.read
    failing = threading.Event()
    failures = [0]

    def flaky_read(fn):
        if failing.is_set():
            failures[0] += 1
            raise DbFailure("persistence_failed", "SQLITE_BUSY")
        return real_read(fn)

    try:
        assert follower.wait_for(lambda c: len(c) == 1)
        monkeypatch.setattr(store.db, "read", flaky_read)
        failing.set()
        insert_run(raw, "b")
        raw.commit()
        time.sleep(1.5)
        assert follower.error is None and follower.ids() == ["a"]
        failing.clear()
        assert follower.wait_for(lambda c: len(c) == 2, timeout=20)
    finally:
        assert follower.close()
    assert failures[0] >= 2
    assert follower.error is None
    assert follower.ids() == ["a", "b"]


def test_follow_raises_source_changed_when_an_older_copy_is_restored_under_it(store, raw, backend, tmp_path):
    """The follower is ahead of the restored copy: it stops with SourceChanged, never waits silently."""
    insert_run(raw, "a")
    insert_run(raw, "b")
    raw.commit()
    follower = Follower(store, poll_interval=60)

    def write_more():
        for i in range(3):
            insert_run(raw, f"later-{i}")
        raw.commit()
        follower.wait_for(lambda c: len(c) == 5)

    try:
        restore_older_copy(store, raw, backend, tmp_path, write_more)
        deadline = time.monotonic() + 10
        while follower.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        follower.close()
    assert isinstance(follower.error, SourceChanged), follower.error
    assert follower.ids() == ["a", "b", "later-0", "later-1", "later-2"]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_commit_made_while_the_listener_is_away_is_delivered_without_a_poll(store, db_url, monkeypatch):
    """PostgreSQL only: SQLite's follower watches the file and has no listening connection to lose.

    A NOTIFY sent while nobody listens is gone; the query is the truth. The listener's connection is
    terminated and its reconnect held back until a peer has committed: once it listens again the
    follower must query by itself, with the fallback poll an hour away."""
    from fencepost.changefeed import follow as follow_module

    away = threading.Event()
    back = threading.Event()
    back.set()
    real_connect = follow_module._PostgresWaiter._connect

    def held_connect(self):
        if not back.is_set():
            away.set()
            back.wait(30)
        return real_connect(self)

    monkeypatch.setattr(follow_module._PostgresWaiter, "_connect", held_connect)
    app = f"fencepost-follow-{store.db.schema}"[:63]
    with fencepost.open(db_url) as peer:
        def commit(run_id: str) -> None:
            peer.db.write(lambda conn: insert_run(conn, run_id))

        def listener_pids() -> list[int]:
            return peer.db.read(lambda conn: [r[0] for r in conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE application_name = :a"), {"a": app})])

        commit("before")
        follower = Follower(store, poll_interval=3600)
        try:
            assert follower.wait_for(lambda c: c and c[-1].run_id == "before")
            deadline = time.monotonic() + 20
            while not listener_pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            back.clear()
            victims = listener_pids()
            assert len(victims) == 1
            peer.db.write(lambda conn: conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": victims[0]}))
            assert away.wait(20), "the listener never tried to reconnect"
            commit("during")  # its NOTIFY reaches nobody
            back.set()
            assert follower.wait_for(lambda c: c[-1].run_id == "during", timeout=20)
        finally:
            back.set()
            assert follower.close()
    assert follower.error is None
    assert follower.ids() == ["before", "during"]
