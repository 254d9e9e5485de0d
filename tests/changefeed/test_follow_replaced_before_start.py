"""A follow started on a store whose database was replaced (or deleted) before the follow began.

Defect (found by a fault hunt, SQLite): a writable store keeps to the file it opened, so once that
file is deleted or another file is moved over its path every read of the store fails with
``persistence_failed`` ("open the store again"). A follower started after that moment took the file
then at the path as the one to follow, so its replacement check passed, and it retried the failing
reads with backoff for ever: ``follow``, ``follow_batches`` and ``afollow`` never yielded and never
raised. The same check of the projection builder let ``run()`` log "catch-up failed; retrying" at
every poll for ever. Now the follower compares the path with the file the store has open and raises
``SourceChanged`` at once (the builder: ``ProjectionError`` with ``source_replaced``), as when the
file is replaced while it follows.

On PostgreSQL a schema dropped and recreated is a new database the store's next connection sees: a
follow started afterwards follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

import fencepost
from fencepost.errors import ProjectionError, SourceChanged
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.conftest import drop_schema, require_postgres

_FOLLOW_KINDS = ["follow", "follow_batches", "afollow"]


def _sqlite_path(url: str) -> str:
    return url[len("sqlite:///"):]


def _remove(path: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass


def _replace(url: str, how: str, make_db_url: Callable[[], str]) -> None:
    """Delete the store's database, or put another database in its place, leaving new runs in it."""
    if url.startswith("sqlite:"):
        path = _sqlite_path(url)
        if how == "deleted":
            _remove(path)
            return
        other_url = make_db_url()
        with fencepost.open(other_url) as other:
            for i in range(3):
                other.runs.create(f"new-{i}", "{}")
        other_path = _sqlite_path(other_url)
        _remove(path)
        os.replace(other_path, path)
        return
    drop_schema(require_postgres(), url.rsplit("schema=", 1)[1])
    if how == "replaced":
        with fencepost.open(url) as fresh:
            for i in range(3):
                fresh.runs.create(f"new-{i}", "{}")


def _first_of(store: Any, kind: str, stop: threading.Event) -> Any:
    """What the follow of ``kind`` first yields (a change, or a page), or the error it raises."""
    # Each follow is closed once read, so its threads end here, not when it is collected.
    if kind == "afollow":
        async def first() -> Any:
            follow = store.feed.afollow(stop=stop, poll_interval=0.2)
            try:
                async for change in follow:
                    return change
                return None
            finally:
                await follow.aclose()
        return asyncio.run(first())
    with contextlib.closing(getattr(store.feed, kind)(stop=stop, poll_interval=0.2)) as follow:
        for item in follow:
            return item
    return None


def _run_with_deadline(fn: Callable[[], Any], stop: threading.Event, seconds: float = 15.0) -> list[Any]:
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(("value", fn()))
        except BaseException as exc:  # what the follow raised is the result
            outcome.append(("error", exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    stop.set()  # a follow still waiting: end it, then report that it hung
    thread.join(10)
    assert outcome, "the follow neither yielded nor raised"
    return outcome


@pytest.mark.parametrize("backend", ["sqlite"])  # a file replaced under the store; PostgreSQL below
@pytest.mark.parametrize("how", ["replaced", "deleted"])
@pytest.mark.parametrize("kind", _FOLLOW_KINDS)
def test_a_follow_started_after_the_sqlite_file_was_replaced_raises_source_changed(
        db_url, make_db_url, kind, how):
    store = fencepost.open(db_url)
    try:
        store.runs.create("old-0", "{}")
        _replace(db_url, how, make_db_url)
        stop = threading.Event()
        [(what, result)] = _run_with_deadline(lambda: _first_of(store, kind, stop), stop)
        assert what == "error" and isinstance(result, SourceChanged), (what, result)
        assert _sqlite_path(db_url) not in str(result)
    finally:
        store.close()
    # Opened again, the store is the database now at the path, and a follow reads it.
    if how == "replaced":
        with fencepost.open(db_url) as reopened:
            stop = threading.Event()
            [(what, change)] = _run_with_deadline(lambda: _first_of(reopened, "follow", stop), stop)
            assert what == "value" and change.run_id == "new-0"


@pytest.mark.parametrize("backend", ["postgresql"])
@pytest.mark.parametrize("kind", _FOLLOW_KINDS)
def test_a_follow_started_after_the_postgres_schema_was_recreated_follows_the_new_one(
        db_url, make_db_url, kind):
    store = fencepost.open(db_url)
    try:
        store.runs.create("old-0", "{}")
        _replace(db_url, "replaced", make_db_url)
        stop = threading.Event()
        [(what, first)] = _run_with_deadline(lambda: _first_of(store, kind, stop), stop)
        assert what == "value", first
        run_id = first.changes[0].run_id if kind == "follow_batches" else first.run_id
        assert run_id == "new-0"
    finally:
        store.close()


# A PostgreSQL schema dropped and not recreated is a database not there yet: waited for.
@pytest.mark.parametrize(("backend", "how"), [("sqlite", "replaced"), ("sqlite", "deleted"),
                                              ("postgresql", "replaced")])
def test_a_builder_run_started_after_the_source_was_replaced_does_not_retry_for_ever(
        backend, db_url, make_db_url, how):
    target_url = make_db_url()
    store = fencepost.open(db_url)
    builder = ProjectionBuilder(store, target_url, RunsByStatus(), poll_interval=0.2)
    try:
        store.runs.create("old-0", "{}")
        assert builder.catch_up().applied == 1
        _replace(db_url, how, make_db_url)
        if backend == "sqlite":
            stop = threading.Event()
            [(what, error)] = _run_with_deadline(lambda: builder.run(stop), stop)
            assert what == "error" and isinstance(error, ProjectionError), (what, error)
            assert error.code == "projection_failed" and error.source_replaced
        else:
            # A recreated schema is a new source: the builder rebuilds onto it while it follows.
            stop = threading.Event()
            thread = threading.Thread(target=builder.run, args=(stop,), daemon=True)
            thread.start()
            try:
                deadline = threading.Event()
                for _ in range(200):
                    if builder.status().rebuilds == 1 and builder.status().lag == 0:
                        break
                    deadline.wait(0.1)
                assert builder.status().rebuilds == 1 and builder.status().lag == 0
            finally:
                stop.set()
                thread.join(20)
            assert not thread.is_alive()
    finally:
        builder.close()
        store.close()
