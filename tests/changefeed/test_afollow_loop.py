"""``afollow`` inside a real asyncio service: the loop, its default executor and the connections.

Each test names what was wrong in its docstring. Both backends; the writer of the live-change test
is a separate process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

import fencepost
from fencepost.changefeed.follow import MAX_POLL_INTERVAL
from tests.changefeed import _workers
from tests.changefeed.conftest import insert_run
from tests.conftest import require_postgres


def _listeners(store: fencepost.Store) -> int:
    """PostgreSQL sessions of this store's followers (their LISTEN connections); 0 on SQLite."""
    if store.db.name != "postgresql":
        return 0
    engine = create_engine(require_postgres(), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"),
                                    {"a": f"fencepost-follow-{store.db.schema}"[:63]}).scalar())
    finally:
        engine.dispose()


async def _until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def test_many_afollows_leave_the_default_executor_free_and_all_see_another_process_commit(store, db_url):
    """Each ``afollow`` held one thread of the loop's default executor for as long as it followed
    (it waited for the next change inside ``asyncio.to_thread``). The default executor has
    ``min(32, cpus + 4)`` threads, so a handful of idle followers starved it: every other
    ``asyncio.to_thread`` of the service (``supervise``'s exit included) waited forever, and the
    followers past the limit never started."""
    followers = 8

    async def main() -> tuple[object, list[list[str]]]:
        seen: list[list[str]] = [[] for _ in range(followers)]

        async def consume(i: int) -> None:
            async for change in store.feed.afollow(poll_interval=60):
                seen[i].append(change.run_id)

        tasks = [asyncio.create_task(consume(i)) for i in range(followers)]
        try:
            await asyncio.sleep(0.5)
            try:
                answer: object = await asyncio.wait_for(asyncio.to_thread(lambda: 42), 5)
            except TimeoutError:
                answer = "starved"
            proc = multiprocessing.get_context("spawn").Process(target=_workers.insert_one,
                                                                args=(db_url, "from-another-process"))
            proc.start()
            await asyncio.to_thread(proc.join, 60)
            assert proc.exitcode == 0
            await _until(lambda: all(s == ["from-another-process"] for s in seen), 10)
            return answer, seen
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    answer, seen = asyncio.run(main())
    assert answer == 42
    assert seen == [["from-another-process"]] * followers


class _HeldClose:
    """The follower ``afollow`` wraps, its ``close()`` held until the test lets it go: where it ran
    (which thread), whether the loop got on meanwhile."""

    def __init__(self, it) -> None:
        self._it = it
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.closed_on: int | None = None

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def close(self) -> None:
        self.closed_on = threading.get_ident()
        self.entered.set()
        self.release.wait(CLOSE_HELD_S)  # a close on the loop's thread holds the loop this long
        try:
            self._it.close()
        finally:
            self.finished.set()


CLOSE_HELD_S = 5


def test_leaving_an_afollow_blocks_no_loop_and_returns_its_connections(store, raw, monkeypatch):
    """Leaving ``async for`` with ``break`` closed the follower on the event loop's own thread: on
    PostgreSQL that joined the listener thread, freezing every other task of the loop for about half
    a second. The read connection the follower had used stayed checked out by the executor thread
    until the loop itself was closed.

    No stall is timed: the follower's ``close()`` is held until the loop itself lets it go. Run off
    the loop, the loop gets on meanwhile (it sees the close begun, not finished, and releases it);
    run on the loop, the loop is stuck in it until ``CLOSE_HELD_S`` passes and finds it finished."""
    from fencepost.changefeed import follow as follow_module

    insert_run(raw, "a")
    raw.commit()
    baseline = store.db.engine.pool.checkedout()
    held: list[_HeldClose] = []
    real_follow = follow_module.follow

    def follow(*args, **kwargs):
        held.append(_HeldClose(real_follow(*args, **kwargs)))
        return held[-1]

    monkeypatch.setattr(follow_module, "follow", follow)

    async def main() -> tuple[list[tuple[bool, bool, int]], bool, int]:
        looked: list[tuple[bool, bool, int]] = []  # per follower: close begun, finished, ticks meanwhile
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        tick = asyncio.create_task(ticker())
        try:
            for _ in range(2):
                async for change in store.feed.afollow(poll_interval=60):
                    assert change.run_id == "a"
                    break
                closing = held[-1]
                begun = await _until(closing.entered.is_set, CLOSE_HELD_S * 2)
                before = ticks
                await _until(lambda b=before: ticks >= b + 3, CLOSE_HELD_S * 2)  # other tasks run meanwhile
                looked.append((begun, closing.finished.is_set(), ticks - before))
                closing.release.set()
                await asyncio.to_thread(closing.finished.wait, CLOSE_HELD_S * 2)
            released = await _until(lambda: store.db.engine.pool.checkedout() == baseline, 5)
            return looked, released, await asyncio.to_thread(_listeners, store)
        finally:
            tick.cancel()
            for closing in held:
                closing.release.set()

    loop_thread = threading.get_ident()  # asyncio.run runs the loop on this thread
    looked, released, listeners = asyncio.run(main())
    assert [(begun, finished) for begun, finished, _ in looked] == [(True, False)] * 2, (
        f"the loop waited for the follower's close: {looked}")
    assert all(ticks >= 3 for *_, ticks in looked), looked
    assert all(h.closed_on not in (None, loop_thread) for h in held), "the follower was closed on the loop's thread"
    assert released, "the follower's read connection was not returned to the pool"
    assert listeners == 0


def test_a_store_closed_under_an_afollow_ends_it_within_moments_not_the_poll_interval(db_url, idle_follower):
    """On PostgreSQL a follower whose store was closed kept waiting (and kept its LISTEN connection
    open) until its next poll, up to ``poll_interval`` (an hour at most) after ``close()``; on
    SQLite only the file events of the close happened to wake it. Here the poll is an hour away,
    so a follower that ends does so because the store closed, with the closed error; one that
    does not is still following when the test gives up waiting (long before any poll)."""
    store = fencepost.open(db_url)
    polls = 0
    changes_since = store.feed.changes_since

    def counted(*args, **kwargs):  # every query of the follower
        nonlocal polls
        polls += 1
        return changes_since(*args, **kwargs)

    store.feed.changes_since = counted

    async def main() -> tuple[BaseException | None, int, bool]:
        async def consume() -> None:
            async for _ in store.feed.afollow(poll_interval=MAX_POLL_INTERVAL):
                pass

        task = asyncio.create_task(consume())
        assert await _until(lambda: polls >= 1, 20), "the follower never queried"
        # Caught up and waiting (PostgreSQL: its listener's connect paged once more): the next poll
        # is an hour away.
        assert await _until(idle_follower.now, 20), "the follower never settled"
        before = polls
        await asyncio.to_thread(store.close)
        try:
            await asyncio.wait_for(task, 60)
        except TimeoutError:
            return None, polls - before, False
        except BaseException as exc:  # the follower's ending is the result under test
            return exc, polls - before, True
        return None, polls - before, True

    try:
        error, queried, ended = asyncio.run(main())
    finally:
        store.close()
    assert ended, "the follower was still waiting for its next poll after close()"
    assert isinstance(error, fencepost.RunStoreError) and "the store is closed" in str(error)
    assert queried <= 1, f"the follower queried {queried} times after close()"  # at most the one that fails
    assert _listeners(store) == 0


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_afollow_cancelled_or_timed_out_stops_its_thread_and_listener(store, how):
    """Companion to the executor fix: a follow cancelled by ``task.cancel()`` or ended by
    ``asyncio.timeout`` stops its dedicated thread and closes its listener connection."""

    async def main() -> None:
        async def consume() -> None:
            async for _ in store.feed.afollow(poll_interval=60):
                pass

        if how == "cancel":
            task = asyncio.create_task(consume())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await consume()

    import threading

    asyncio.run(main())
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and [t for t in threading.enumerate() if t.name.startswith("fencepost-")
                                           and "follow" in t.name]:
        time.sleep(0.02)
    assert not [t.name for t in threading.enumerate() if "follow" in t.name]
    assert _listeners(store) == 0


def _follow_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fencepost-") and "follow" in t.name]


def test_a_cancelled_afollow_stops_its_threads_within_moments(store, idle_follower):
    """The change feed page says leaving an ``async for`` stops the follower's thread "within a
    tenth of a second". On PostgreSQL it took half a second every time: the listener thread waited
    for notifications in slices of 0.5 s and the follower's close joined it, so the thread and the
    LISTEN connection outlived the cancel by 0.5 s (and ``store.close()`` or a projection builder's
    ``close()`` under a follower waited as long). Three cancels; the median must be well under
    half a second (the median, so that one slow scheduling on a busy machine does not decide). Each
    cancel comes once the follower is idle: a listener still connecting is not what is timed."""

    async def one() -> float:
        async def consume() -> None:
            async for _ in store.feed.afollow(poll_interval=60):
                pass

        task = asyncio.create_task(consume())
        assert await _until(lambda: len(_follow_threads()) >= 2, 5)
        assert await _until(idle_follower.now, 20), "the follower never settled"
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _until(lambda: not _follow_threads(), 5), _follow_threads()
        return time.monotonic() - started

    took = [asyncio.run(one()) for _ in range(3)]
    assert sorted(took)[1] < 0.3, f"the follower's threads outlived the cancel by {took} s"
    assert _listeners(store) == 0


def test_a_stopped_follow_returns_within_moments(store, idle_follower):
    """The synchronous twin: ``stop.set()`` under a waiting ``follow`` ended the loop only after the
    PostgreSQL listener's 0.5 s slice ran out."""
    took = []
    for _ in range(3):
        stop = threading.Event()
        ended = threading.Event()

        def follow(stop: threading.Event, ended: threading.Event) -> None:
            for _ in store.feed.follow(stop=stop, poll_interval=60):
                pass
            ended.set()

        thread = threading.Thread(target=follow, args=(stop, ended))
        thread.start()
        idle_follower.wait()  # caught up, its listener or file watch up: what stops is an idle follower
        started = time.monotonic()
        stop.set()
        thread.join(5)
        took.append(time.monotonic() - started)
        assert ended.is_set() and not _follow_threads()
    assert sorted(took)[1] < 0.3, f"follow returned {took} s after stop was set"
