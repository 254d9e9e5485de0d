"""The central race: writer processes churn runs while readers page and follow the feed.

Three writer processes create, mutate and delete runs (own ids and shared ids, single- and
multi-row transactions, some rolled back) as fast as they can for a few seconds, released together
at a barrier. Meanwhile, in this process, one thread pages ``changes_since`` with a small limit, one
follows with ``follow()`` and one with ``afollow()``. At the end each reader's stream must be in
strictly increasing revision order, and replaying it must give exactly the final
``flows_run_changes`` table: no revision skipped, none out of order, no rolled-back write seen.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import threading
import time

import pytest

import fencepost
from fencepost import Change
from tests.changefeed import _workers
from tests.changefeed.conftest import change_table

WRITERS = 3
DURATION = 3.0


def _replay(stream: list[Change]) -> dict[str, tuple[int, bool]]:
    state: dict[str, tuple[int, bool]] = {}
    for change in stream:
        state[change.run_id] = (change.revision, change.deleted)
    return state


def _assert_in_order(stream: list[Change]) -> None:
    revisions = [c.revision for c in stream]
    assert all(a < b for a, b in itertools.pairwise(revisions)), "a revision came out of order"


@pytest.mark.slow
def test_readers_see_exactly_the_final_change_table_under_concurrent_writer_processes(store, raw, db_url):
    origin = fencepost.Position(store.feed.position().source, 0)
    stop = threading.Event()
    done_writing = threading.Event()
    paged: list[Change] = []
    followed: list[Change] = []
    afollowed: list[Change] = []
    pages = [0]
    errors: list[BaseException] = []

    def pager() -> None:
        try:
            position = origin
            while True:
                finished = done_writing.is_set()
                batch = store.feed.changes_since(position, 37)
                pages[0] += 1
                paged.extend(batch.changes)
                position = batch.next_position
                if finished and not batch.has_more:
                    return
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def follower() -> None:
        try:
            for change in store.feed.follow(stop=stop, poll_interval=1.0):
                followed.append(change)
        except BaseException as exc:
            errors.append(exc)

    def async_follower() -> None:
        async def main() -> None:
            async for change in store.feed.afollow(origin, stop=stop, poll_interval=1.0):
                afollowed.append(change)

        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    results = ctx.Queue()
    writers = [
        ctx.Process(target=_workers.churn_to_queue, args=(db_url, k, start, DURATION, 1000 + k, results))
        for k in range(WRITERS)
    ]
    threads = [threading.Thread(target=f) for f in (pager, follower, async_follower)]
    try:
        for t in threads:
            t.start()
        for w in writers:
            w.start()
        time.sleep(1.0)  # let the writers import and open the store; then release them together
        start.set()
        commits = [results.get(timeout=120) for _ in writers]
        for w in writers:
            w.join(timeout=30)
            assert w.exitcode == 0
    finally:
        done_writing.set()
        for w in writers:
            if w.is_alive():
                w.kill()

    final = change_table(raw)
    raw.commit()
    final_state = {run_id: (revision, deleted) for run_id, revision, deleted in final}
    watermark = store.feed.position().revision
    assert final[-1][1] == watermark
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not errors:
        if followed and afollowed and followed[-1].revision == watermark == afollowed[-1].revision:
            break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()
    assert not errors, errors
    assert sum(commits) >= 100, "the writers barely ran"
    assert not any(c.run_id.startswith("ghost-") for c in paged + followed + afollowed)
    for stream in (paged, followed, afollowed):
        _assert_in_order(stream)
        assert _replay(stream) == final_state
    # Coalescing really happened: the readers saw intermediate revisions the table no longer holds.
    assert len(paged) >= len(final) and pages[0] > 1
