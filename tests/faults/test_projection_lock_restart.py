"""The builder's lock outlives a PostgreSQL server restart under it (a private ``initdb`` instance).

On PostgreSQL the lock that keeps one builder per projection name is a session advisory lock on a
connection of its own; a server restart ends that session and the lock with it. Defect: the builder
went on as if it still held the lock (it never looked again), so a second builder of the same name
was let in while the first kept applying; ``builder_busy`` was never said. Now each call (and each
pass of ``run``) finds a lock whose connection died and takes it again, or says ``builder_busy``
when another builder took it meanwhile.

PostgreSQL only: SQLite's lock is an ``flock`` held by the builder's process, which no fault of the
database file takes away.
"""

from __future__ import annotations

import threading
import time

import pytest

import fencepost
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.conftest import run_in_background

pytestmark = pytest.mark.slow


def test_a_builder_takes_its_lock_again_after_a_restart_and_keeps_others_out(private_server) -> None:
    url = private_server.url
    with fencepost.open(url) as store:
        store.runs.create("before", "{}")
        with ProjectionBuilder(store, url, RunsByStatus(), lock_timeout=0, poll_interval=0.1) as first:
            stop = threading.Event()
            thread, failed = run_in_background(lambda: first.run(stop))
            try:
                deadline = time.monotonic() + 20
                while first.status().lag:  # the builder has reached the server and holds its lock
                    assert time.monotonic() < deadline and not failed, failed
                    time.sleep(0.05)
                private_server.restart()
                store.runs.create("after", "{}")
                head = store.feed.position().revision
                deadline = time.monotonic() + 20
                while first.status().applied_revision < head:  # the first builder's pass after the restart
                    assert time.monotonic() < deadline and not failed, failed
                    time.sleep(0.05)
                with ProjectionBuilder(store, url, RunsByStatus(), lock_timeout=0) as second:
                    with pytest.raises(ProjectionError) as caught:
                        second.catch_up()
                assert caught.value.code == "builder_busy"
            finally:
                stop.set()
                thread.join(10)
            assert not failed, failed


def test_a_builder_whose_lock_was_taken_after_a_restart_says_builder_busy(private_server) -> None:
    url = private_server.url
    with fencepost.open(url) as store:
        store.runs.create("before", "{}")
        with ProjectionBuilder(store, url, RunsByStatus(), lock_timeout=0) as first:
            assert first.catch_up().applied == 1
            private_server.restart()
            with ProjectionBuilder(store, url, RunsByStatus(), lock_timeout=0) as second:
                store.runs.create("after", "{}")
                assert second.catch_up().applied == 1  # the name was free: the first builder lost it
                with pytest.raises(ProjectionError) as caught:
                    first.catch_up()
                assert caught.value.code == "builder_busy"
                assert first.status().applied_revision == second.status().applied_revision  # it applied nothing
            assert first.catch_up().applied == 0  # the second one is gone: the name is the first's again
