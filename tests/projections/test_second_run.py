"""A second ``run()`` on one builder while the first follows, from another thread: refused at once.

Defect: the second call waited, without a word, for the first to end, which a follow loop does only
when its ``stop`` is set: a program that started the builder's loop twice (a service's start hook
run twice, a retry that did not see the first loop was alive) hung a thread for good. A second
builder of the same name is told at once (``builder_busy``); so is a second ``run()`` of one
builder now, naming the call that holds it. Once the first ``run()`` has returned, ``run()`` may
be called again. Real threads against real databases, both backends.
"""

from __future__ import annotations

import threading
import time

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections._following import Following


def test_a_second_run_on_one_builder_is_refused_at_once_while_the_first_follows(store, target_url):
    for i in range(3):
        store.runs.create(f"r{i}", "{}")
    builder = ProjectionBuilder(store, target_url, RunsByStatus(), poll_interval=0.05)
    try:
        with Following(builder) as first:
            assert first.wait(lambda: builder.status().lag == 0)
            second = Following(builder)
            started = time.monotonic()
            with second:
                second.thread.join(timeout=10)
                waited = time.monotonic() - started
                assert not second.thread.is_alive(), "the second run() is still waiting for the first"
            assert waited < 5, waited
            [error] = second.failure
            assert isinstance(error, ProjectionError) and error.code == "builder_busy", error
            assert "run() is already following" in str(error), error
            # The first loop is unharmed: it still follows.
            store.runs.create("late", "{}")
            assert first.wait(lambda: builder.status().lag == 0 and builder.status().applied == 4)
            assert not first.failure, first.failure
        assert not first.thread.is_alive()
        # Once the first run() returned, run() may be called again on the same builder.
        stop = threading.Event()
        again = threading.Thread(target=builder.run, args=(stop,))
        again.start()
        store.runs.create("later", "{}")
        deadline = time.monotonic() + 20
        while builder.status().applied < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        again.join(timeout=20)
        assert builder.status().applied == 5
    finally:
        builder.close()
