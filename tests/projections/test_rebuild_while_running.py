"""``rebuild()`` called from another thread while ``run()`` follows the source: the caller gets the
rebuild it asked for, reported as one (``rebuilt=True``), and exactly one ``requested`` rebuild is
recorded per call.

Before: ``rebuild()`` committed the start of its shadow fill, then caught up; the follow loop's next
pass saw the pending rebuild and filled and swapped it itself, and the caller's catch-up, finding
its shadow checkpoint moved under it, retried, found nothing pending and returned ``rebuilt=False``
for a rebuild that had happened (its ``on_progress`` never reached the head of a rebuild either).
Real threads against real databases, both backends, every target placement.
"""

from __future__ import annotations

import threading
import time

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.conftest import run_in_background
from tests.projections._following import Following
from tests.projections._several import KINDS, seed


def test_rebuild_from_another_thread_while_run_follows_is_done_and_reported(store, target_url):
    for i in range(12):
        store.runs.create(f"r{i}", "{}")
    # One change per page, and a follow loop that looks every 10 ms: a rebuild takes a dozen pages,
    # plenty of passes of the loop to step into it.
    builder = ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=1, poll_interval=0.01)
    try:
        with Following(builder) as following:
            assert following.wait(lambda: builder.status().lag == 0)
            before = len(builder.rebuilds())
            for attempt in range(5):
                seen: list[tuple[int, int]] = []
                result = builder.rebuild(on_progress=lambda r, h, seen=seen: seen.append((r, h)))
                assert result.rebuilt, (attempt, result)
                assert seen[0][0] == 0 and seen[-1][0] == seen[-1][1] == result.revision, (attempt, seen)
                assert result.applied == 12, (attempt, result)
                records = builder.rebuilds()
                assert len(records) == before + attempt + 1, (attempt, records)
                assert records[-1].reason == "requested"
            # The loop carries on following after the rebuilds.
            store.runs.create("late", "{}")
            assert following.wait(lambda: builder.status().lag == 0)
            assert not following.failure, following.failure
    finally:
        builder.close()


def test_run_stops_promptly_while_a_rebuild_from_another_thread_holds_the_source(store, target_url):
    """``run`` waits for a rebuild under way in another thread before its next pass, but not past
    its ``stop``: stopped meanwhile, it returns at once, and the rebuild completes."""
    for i in range(4):
        store.runs.create(f"r{i}", "{}")
    builder = ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=1, poll_interval=0.01)
    try:
        with Following(builder) as following:
            assert following.wait(lambda: builder.status().lag == 0)
            midway, release = threading.Event(), threading.Event()

            def progress(revision: int, head: int) -> None:
                if revision == 2:
                    midway.set()
                    assert release.wait(10)

            outcome: list[object] = []
            thread, errors = run_in_background(lambda: outcome.append(builder.rebuild(on_progress=progress)))
            assert midway.wait(10)
            time.sleep(0.1)  # several poll intervals: run's next pass is waiting for the source
            started = time.monotonic()
            following.stop.set()
            following.thread.join(5)
            # Stopping takes about 0.1 s (0.2 s with the CPU busy); a run that waited for the
            # rebuild would still be waiting at the join's 5 s (the rebuild is released after it),
            # and a watcher that did not stop holds run's exit for its own 5 s join: 3 s leaves a
            # loaded machine room and stays below both.
            assert not following.thread.is_alive() and time.monotonic() - started < 3.0
            assert not following.failure, following.failure
            release.set()
            thread.join(10)
            assert not errors, errors
            [result] = outcome
            assert result.rebuilt and result.applied == 4, result
    finally:
        builder.close()


def test_a_call_waiting_for_its_turn_fails_when_the_builder_is_closed(store, make_db_url):
    """A ``catch_up`` waiting for a ``rebuild`` of another thread to end is told at once when the
    builder is closed meanwhile (``projection_failed``, "the builder is closed"), not left waiting,
    and the rebuild stops before its next write. Both backends."""
    for i in range(4):
        store.runs.create(f"r{i}", "{}")
    builder = ProjectionBuilder(store, make_db_url(), RunsByStatus(), batch_size=1)
    builder.catch_up()
    midway, release = threading.Event(), threading.Event()

    def progress(revision: int, head: int) -> None:
        if revision == 2:
            midway.set()
            assert release.wait(10)

    rebuilding, rebuild_failed = run_in_background(lambda: builder.rebuild(on_progress=progress))
    assert midway.wait(10)
    waiting, wait_failed = run_in_background(builder.catch_up)
    time.sleep(0.2)
    assert waiting.is_alive(), "catch_up did not wait for the rebuild under way"
    builder.close()
    waiting.join(5)  # returns as soon as it ends (within 0.05 s); a waiter the close missed never does
    assert not waiting.is_alive(), "catch_up kept waiting after the builder was closed"
    release.set()
    rebuilding.join(10)
    for failed in (wait_failed, rebuild_failed):
        [exc] = failed
        assert isinstance(exc, ProjectionError) and exc.code == "projection_failed", exc
        assert "the builder is closed" in str(exc)


def test_rebuild_of_named_sources_while_run_follows_each_is_done_and_reported(sources, make_db_url):
    """With several sources ``run`` follows each in its own thread; ``rebuild(name)`` and
    ``rebuild()`` from the caller's thread are each done by the call and reported per source.
    Two SQLite stores and one PostgreSQL store, onto a target of each backend."""
    ids: dict[str, list[str]] = {name: [] for name in sources}
    for name, store in sources.items():
        seed(store, ids[name], "w", 8)
    builder = ProjectionBuilder(sources, make_db_url(), RunsByStatus(), batch_size=1, poll_interval=0.01)
    try:
        with Following(builder) as following:
            assert following.wait(lambda: all(st.lag == 0 for st in builder.status().values()))
            for attempt in range(3):
                one = builder.rebuild("central")
                assert list(one) == ["central"] and one["central"].rebuilt, (attempt, one)
                assert one["central"].applied == 8, (attempt, one)
                every = builder.rebuild()
                assert list(every) == list(KINDS), (attempt, every)
                assert all(r.rebuilt and r.applied == 8 for r in every.values()), (attempt, every)
            counts = {name: len(records) for name, records in builder.rebuilds().items()}
            assert counts == {"edge-1": 3, "edge-2": 3, "central": 6}, counts
            assert not following.failure, following.failure
    finally:
        builder.close()
