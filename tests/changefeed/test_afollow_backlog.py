"""``afollow`` catching up a backlog: the same changes as ``follow``, handed over a page at a time.

Defect (found by a scale hunt): ``afollow`` handed its changes from the follower's thread to the
event loop one at a time, one thread round trip (a request, a ``next()``, a
``call_soon_threadsafe``) per change. Catching up 30,000 changes from revision 0 took 3.5 to 5.3 s
where ``follow`` took 0.2 to 1.2 s (about 100 µs of CPU per change), 100,000 changes 32 s against
4 s. The round trips are counted here, not timed: over a backlog of a few thousand changes they
must be far fewer than the changes. What must not change is checked beside it: the same sequence
as ``follow`` (tombstones included), ``stop`` obeyed at the very change it was set after, an error
raised only after the changes before it, a follower that reads no further ahead than the page it
holds, and a cancel in the middle of a backlog that leaves no thread behind. Both backends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from sqlalchemy import text

import fencepost
from fencepost import Change, Position, SourceChanged
from fencepost.changefeed import follow as follow_module
from tests.changefeed.conftest import page_all

RUNS = 2400  # about five pages of the follower's
DELETED = 400
UPDATED = 300


def _backlog(store: fencepost.Store, raw: Any) -> list[Change]:
    """A backlog of creations, updates and deletions (tombstones); every change in the feed."""
    ids = [f"run-{i:05d}" for i in range(RUNS)]  # one statement each (their ids are literals)
    rows = ", ".join(f"('{run_id}', 'pending', '{{\"flowName\": \"flow\"}}', {i})" for i, run_id in enumerate(ids))
    raw.execute(text(f"INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES {rows}"))
    raw.commit()
    updated = ", ".join(f"'{run_id}'" for run_id in ids[0:UPDATED * 3:3])
    raw.execute(text(f"UPDATE flows_runs SET state_json = '{{\"flowName\": \"other\"}}' WHERE run_id IN ({updated})"))
    raw.commit()
    deleted = ", ".join(f"'{run_id}'" for run_id in ids[1:DELETED * 5:5])
    raw.execute(text(f"DELETE FROM flows_runs WHERE run_id IN ({deleted})"))
    raw.commit()
    changes = page_all(store.feed, Position(store.feed.position().source, 0))
    assert len(changes) == RUNS and sum(c.deleted for c in changes) == DELETED
    return changes


def _key(changes: list[Change]) -> list[tuple[str, int, bool]]:
    return [(c.run_id, c.revision, c.deleted) for c in changes]


def _follow(store: fencepost.Store, count: int, position: Position | None = None) -> list[Change]:
    stop = threading.Event()
    seen: list[Change] = []
    for change in store.feed.follow(position, stop=stop, poll_interval=60):
        seen.append(change)
        if len(seen) >= count:
            stop.set()
    return seen


def _run(main: Any) -> tuple[Any, int]:
    """Run ``main()`` on a loop of its own; what it returned, and how often another thread called
    ``call_soon_threadsafe`` on that loop (every hand-over from a follower's thread is one)."""
    loop = asyncio.new_event_loop()
    calls = 0
    real = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        return loop.run_until_complete(asyncio.wait_for(main(), 60)), calls
    finally:
        loop.close()


def _follow_threads(before: set[threading.Thread]) -> list[str]:
    return [t.name for t in threading.enumerate()
            if t not in before and t.is_alive() and t.name.startswith(("fencepost-follow", "fencepost-afollow"))]


def test_afollow_yields_the_backlog_follow_yields_in_a_few_hand_overs(store, raw):
    expected = _backlog(store, raw)
    followed = _follow(store, len(expected))

    async def main() -> list[Change]:
        stop = threading.Event()
        seen: list[Change] = []
        async for change in store.feed.afollow(stop=stop, poll_interval=60):
            seen.append(change)
            if len(seen) >= len(expected):
                stop.set()
        return seen

    afollowed, handovers = _run(main)
    assert _key(followed) == _key(expected)
    assert _key(afollowed) == _key(expected)
    # One per change before the fix (2,400 here); now about one per page of 500.
    assert handovers <= len(expected) // 100, f"{handovers} thread hand-overs for {len(expected)} changes"


@pytest.mark.parametrize("kind", ["threading", "asyncio"])
@pytest.mark.parametrize("after", [7, 500, 1234])
def test_a_stop_set_by_the_consumer_ends_afollow_at_that_change_as_follow(store, raw, kind, after):
    expected = _backlog(store, raw)
    assert _key(_follow(store, after)) == _key(expected[:after])

    async def main() -> list[Change]:
        stop = threading.Event() if kind == "threading" else asyncio.Event()
        seen: list[Change] = []
        async for change in store.feed.afollow(stop=stop, poll_interval=60):
            seen.append(change)
            if len(seen) == after:
                stop.set()
        return seen

    seen, _ = _run(main)
    assert _key(seen) == _key(expected[:after])


def test_afollow_left_in_a_page_and_resumed_delivers_every_change_once(store, raw):
    expected = _backlog(store, raw)

    async def take(position: Position | None, count: int, leave: str) -> list[Change]:
        seen: list[Change] = []
        stop = threading.Event()
        async for change in store.feed.afollow(position, stop=stop, poll_interval=60):
            seen.append(change)
            if len(seen) == count:
                if leave == "break":
                    break
                stop.set()
        return seen

    async def main() -> list[Change]:
        first = await take(None, 700, "break")  # in the middle of the follower's second page
        rest = await take(first[-1].position, len(expected) - 700, "stop")
        return first + rest

    both, _ = _run(main)
    assert _key(both) == _key(expected)


def test_an_error_is_raised_after_the_changes_before_it(store, raw):
    expected = _backlog(store, raw)
    real = store.feed.changes_since
    pages = 0

    def second_page_fails(*args: Any, **kwargs: Any) -> Any:
        nonlocal pages
        pages += 1
        if pages == 2:
            raise SourceChanged("invalid_run", "follow", "rotated under the follower (test)")
        return real(*args, **kwargs)

    store.feed.changes_since = second_page_fails  # type: ignore[method-assign]

    seen_sync: list[Change] = []
    with pytest.raises(SourceChanged):
        for change in store.feed.follow(poll_interval=60):
            seen_sync.append(change)
    pages = 0

    async def main() -> tuple[list[Change], BaseException | None]:
        seen: list[Change] = []
        try:
            async for change in store.feed.afollow(poll_interval=60):
                seen.append(change)
        except SourceChanged as exc:
            return seen, exc
        return seen, None

    (seen, error), _ = _run(main)
    assert isinstance(error, SourceChanged)
    assert _key(seen) == _key(seen_sync) == _key(expected[:follow_module.PAGE])


def test_a_slow_consumer_holds_the_follower_to_the_page_it_has(store, raw, monkeypatch):
    """Back-pressure: while the consumer dwells on a change the follower reads no further page, and
    it never holds more than one page of changes the consumer has not taken."""
    expected = _backlog(store, raw)
    real = store.feed.changes_since
    queries = 0

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal queries
        queries += 1
        return real(*args, **kwargs)

    store.feed.changes_since = counted  # type: ignore[method-assign]
    pulled = 0
    real_follow = follow_module.follow

    class Counting:
        def __init__(self, it: Any) -> None:
            self._it = it

        def __iter__(self) -> Counting:
            return self

        def __next__(self) -> Any:
            nonlocal pulled
            item = next(self._it)
            pulled += 1
            return item

        def close(self) -> None:
            self._it.close()

    monkeypatch.setattr(follow_module, "follow", lambda *a, **k: Counting(real_follow(*a, **k)))

    async def main() -> tuple[list[Change], int, int, int]:
        stop = threading.Event()
        seen: list[Change] = []
        ahead = 0
        paused: tuple[int, int] = (0, 0)
        async for change in store.feed.afollow(stop=stop, poll_interval=60):
            seen.append(change)
            ahead = max(ahead, pulled - len(seen))
            if len(seen) == 3:
                await asyncio.sleep(0.5)  # the follower's thread is free to run meanwhile
                paused = (queries, pulled)
            if len(seen) >= len(expected):
                stop.set()
        return seen, ahead, *paused

    (seen, ahead, queries_paused, pulled_paused), _ = _run(main)
    assert _key(seen) == _key(expected)
    assert queries_paused == 1, "the follower read further pages while the consumer dwelt on the first"
    assert pulled_paused <= follow_module.PAGE
    assert ahead < follow_module.PAGE


def test_afollow_cancelled_in_the_middle_of_a_backlog_leaves_no_thread(store, raw):
    _backlog(store, raw)
    before = set(threading.enumerate())

    async def main() -> int:
        seen = 0
        got = asyncio.Event()

        async def consume() -> None:
            nonlocal seen
            async for _ in store.feed.afollow(poll_interval=60):
                seen += 1
                if seen == 10:
                    got.set()
                await asyncio.sleep(0)

        task = asyncio.create_task(consume())
        await got.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen

    seen, _ = _run(main)
    assert 10 <= seen < RUNS
    deadline = time.monotonic() + 3
    while _follow_threads(before) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _follow_threads(before)
