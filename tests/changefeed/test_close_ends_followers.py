"""Closing a store ends its followers, including those suspended between changes; a collected
``afollow`` ends its thread.

Defects:

* ``store.close()`` ended only a follower that was waiting for its next change. One suspended
  between changes (its consumer left ``for``/``async for`` with ``break`` but kept the iterator, or
  was busy with a change) kept its threads (``fencepost-afollow``, the file watcher or the
  PostgreSQL listener) and its ``LISTEN`` session open for as long as the iterator object lived:
  the ``afollow`` thread waited for the loop's next request without a timeout, and the listener
  looked only at its own close, never at the store's.
* An ``afollow`` whose event loop was closed without ``shutdown_asyncgens()`` and that was then
  garbage-collected was never closed: its threads and ``LISTEN`` session stayed for the rest of
  the process.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from collections.abc import Callable

import pytest

import fencepost
from tests.changefeed.conftest import insert_run
from tests.changefeed.test_afollow_loop import _listeners

FOLLOWER_THREADS = ("fencepost-afollow", "fencepost-follow-watch", "fencepost-follow-listen")
BOUND = 3.0  # seconds any release may take (it takes a few tenths)


def _threads(before: set[threading.Thread]) -> list[str]:
    """Follower threads started since ``before`` and still alive."""
    return sorted(t.name for t in threading.enumerate()
                  if t not in before and t.is_alive() and t.name in FOLLOWER_THREADS)


def _until(predicate: Callable[[], bool], timeout: float = BOUND) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return predicate()
        time.sleep(0.02)
    return True


def _running(store: fencepost.Store, before: set[threading.Thread], expected: list[str], sessions: int) -> None:
    """Wait until the followers' threads and (PostgreSQL) LISTEN sessions are all there."""
    listening = sessions if store.db.name == "postgresql" else 0
    assert _until(lambda: _threads(before) == sorted(expected) and _listeners(store) == listening, 10), (
        _threads(before), _listeners(store))


def _released(store: fencepost.Store, before: set[threading.Thread]) -> None:
    assert _until(lambda: not _threads(before) and _listeners(store) == 0), (_threads(before), _listeners(store))


def _assert_closed_error(err: BaseException) -> None:
    """What a follower awaiting its next change gets when the store closes."""
    assert isinstance(err, fencepost.RunStoreError), repr(err)
    assert err.code == "persistence_failed"
    assert "the store is closed" in str(err)


def _watcher(backend: str) -> str:
    return "fencepost-follow-watch" if backend == "sqlite" else "fencepost-follow-listen"


@pytest.mark.parametrize("kind", ["follow", "follow_batches"])
def test_close_ends_a_follow_suspended_between_changes(store, raw, backend, kind):
    """``next(follow)`` then ``store.close()``: the follower's thread and LISTEN session end at once,
    though nothing runs the suspended generator; its next use raises the closed-store error."""
    insert_run(raw, "a")
    raw.commit()
    before = set(threading.enumerate())
    it = store.feed.follow(poll_interval=60) if kind == "follow" else store.feed.follow_batches(poll_interval=60)
    first = next(it)
    assert (first.run_id if kind == "follow" else first.changes[0].run_id) == "a"
    _running(store, before, [_watcher(backend)], 1)
    started = time.monotonic()
    store.close()
    _released(store, before)
    assert time.monotonic() - started < BOUND
    with pytest.raises(fencepost.RunStoreError) as info:
        next(it)
    _assert_closed_error(info.value)
    it.close()


def test_close_ends_an_afollow_left_with_break(store, raw, backend):
    """``async for ...: break`` keeps the iterator; ``store.close()`` then ends its thread, its
    watcher or listener and its LISTEN session within moments (the loop keeps running), and the
    iterator's next use raises the error a follower waiting at the close gets."""
    insert_run(raw, "a")
    raw.commit()
    before = set(threading.enumerate())

    async def main() -> None:
        it = store.feed.afollow(poll_interval=60)
        async for change in it:
            assert change.run_id == "a"
            break
        await asyncio.to_thread(_running, store, before, ["fencepost-afollow", _watcher(backend)], 1)
        store.close()
        await asyncio.to_thread(_released, store, before)
        with pytest.raises(fencepost.RunStoreError) as info:
            await asyncio.wait_for(it.__anext__(), BOUND)
        _assert_closed_error(info.value)
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(it.__anext__(), BOUND)
        await it.aclose()

    asyncio.run(main())


def test_close_ends_several_suspended_followers_at_once(store, raw, backend):
    """An ``afollow`` and a ``follow``, both suspended: one ``store.close()`` releases them all."""
    insert_run(raw, "a")
    raw.commit()
    before = set(threading.enumerate())

    async def main() -> None:
        ait = store.feed.afollow(poll_interval=60)
        assert (await ait.__anext__()).run_id == "a"
        it = store.feed.follow(poll_interval=60)
        assert next(it).run_id == "a"
        await asyncio.to_thread(_running, store, before, ["fencepost-afollow"] + [_watcher(backend)] * 2, 2)
        store.close()
        await asyncio.to_thread(_released, store, before)
        with pytest.raises(fencepost.RunStoreError) as info:
            next(it)
        _assert_closed_error(info.value)
        with pytest.raises(fencepost.RunStoreError) as ainfo:
            await asyncio.wait_for(ait.__anext__(), BOUND)
        _assert_closed_error(ainfo.value)

    asyncio.run(main())


def test_an_afollow_awaiting_its_next_change_still_ends_with_the_closed_error(store, backend):
    """Unchanged: a follower waiting at the close raises the closed-store error and ends its threads."""
    before = set(threading.enumerate())

    async def main() -> None:
        it = store.feed.afollow(poll_interval=60)
        task = asyncio.ensure_future(it.__anext__())
        await asyncio.to_thread(_running, store, before, ["fencepost-afollow", _watcher(backend)], 1)
        store.close()
        with pytest.raises(fencepost.RunStoreError) as info:
            await asyncio.wait_for(task, BOUND)
        _assert_closed_error(info.value)
        await asyncio.to_thread(_released, store, before)

    asyncio.run(main())


def test_a_collected_afollow_ends_its_thread_without_store_close(store, raw, backend):
    """An ``afollow`` iterated on a hand-managed loop closed without ``shutdown_asyncgens()``, then
    collected: its thread, watcher or listener and LISTEN session end, the store still open."""
    insert_run(raw, "a")
    raw.commit()
    before = set(threading.enumerate())
    loop = asyncio.new_event_loop()
    it = store.feed.afollow(poll_interval=60)

    async def first(agen) -> fencepost.Change:
        return await agen.__anext__()

    try:
        assert loop.run_until_complete(first(it)).run_id == "a"
    finally:
        loop.close()  # no shutdown_asyncgens(): nothing will run the generator's cleanup
    _running(store, before, ["fencepost-afollow", _watcher(backend)], 1)
    with warnings.catch_warnings():
        # The loop's finalizer hook fails (the loop is closed) and its ``aclose()`` is never awaited.
        warnings.simplefilter("ignore")
        del it
        gc.collect()
    _released(store, before)
    # The store is unaffected: a new follower works.
    assert next(store.feed.follow(poll_interval=60)).run_id == "a"
