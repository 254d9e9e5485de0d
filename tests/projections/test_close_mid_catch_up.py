"""A builder closed while another thread's catch-up is between two pages does not take its lock
again: the catch-up stops with projection_failed ('the builder is closed') and the name is free
for the next builder.

Before: every write first made sure the lock was held, so the page after ``close()`` took the
released lock again (a new ``flock`` or a new PostgreSQL session) that nothing released any more:
every later builder of that name got builder_busy until the process exited. Both backends, every
target placement.
"""

from __future__ import annotations

import threading

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.conftest import run_in_background


def test_a_builder_closed_mid_catch_up_leaves_its_name_free(store, target_url):
    for i in range(3):
        store.runs.create(f"r{i}", "{}")
    builder = ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=1)
    between_pages, closed = threading.Event(), threading.Event()

    calls = []

    def progress(revision: int, head: int) -> None:
        calls.append(revision)
        if len(calls) == 2:  # the first page committed: let close() run before the next one
            between_pages.set()
            assert closed.wait(10)

    outcome: list[object] = []

    def catch_up() -> None:
        try:
            outcome.append(builder.catch_up(on_progress=progress))
        except ProjectionError as exc:
            outcome.append(exc)

    thread, errors = run_in_background(catch_up)
    assert between_pages.wait(10)
    builder.close()
    closed.set()
    thread.join(10)
    assert not thread.is_alive() and not errors
    [result] = outcome
    assert isinstance(result, ProjectionError), result
    assert result.code == "projection_failed" and "the builder is closed" in str(result)
    # The name is free: the next builder takes it at once (lock_timeout 0) and finishes the work.
    with ProjectionBuilder(store, target_url, RunsByStatus(), lock_timeout=0) as after:
        done = after.catch_up()
    assert done.revision >= calls[-1] and done.revision > 0
