"""A SQLite database file deleted, or another file moved over it, while a store has it open.

Defect: the store's kept connections still held the old, unlinked file, so a write on a thread that
had one "succeeded" into a file nobody can open any more (reported committed, then lost when the
store closed); a thread without one opened a new connection, which created an empty file at the
path (an unmigrated database another ``fencepost.open`` would then start over in) and failed with a
bare ``SQLITE_ERROR``; and with another database moved over the path, new connections wrote into
that other database. Now a writable store remembers which file it opened: a write transaction, and
any new connection, checks that the path still names that file, and otherwise fails with
``persistence_failed``, ``db_code`` ``file_replaced`` and a message saying so, writes nothing and
creates nothing. (PostgreSQL has no file; a dropped schema fails its statements as they are.)
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

import fencepost
from tests.faults.test_replaced_database import _move_over, _remove_database

pytestmark = pytest.mark.slow


def _create(store: fencepost.Store, run_id: str) -> BaseException | None:
    """``runs.create(run_id)``, the error it raised (or None), from a new thread (a new connection)."""
    seen: list[BaseException | None] = []

    def work() -> None:
        try:
            store.runs.create(run_id, "{}")
            seen.append(None)
        except BaseException as exc:  # reported to the test
            seen.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    return seen[0]


def _assert_refused(exc: BaseException | None) -> None:
    assert isinstance(exc, fencepost.RunStoreError), exc
    assert (exc.code, exc.db_code) == ("persistence_failed", "file_replaced")  # type: ignore[attr-defined]
    assert "deleted or replaced" in str(exc), str(exc)


def test_writes_after_the_file_is_deleted_are_refused_and_create_nothing(tmp_path: Path, clock) -> None:
    path = tmp_path / "flows.db"
    store = fencepost.open(f"sqlite:///{path}", clock=clock)
    try:
        store.runs.create("before", "{}")  # this thread keeps a write connection on the file
        _remove_database(path)
        with pytest.raises(fencepost.RunStoreError) as err:  # the kept connection
            store.runs.create("lost", "{}")
        _assert_refused(err.value)
        _assert_refused(_create(store, "lost-too"))  # a new connection
        with pytest.raises(fencepost.JournalError) as journal:
            store.journal.transact(lambda tx: tx.append_unfenced("before", "x", {}, source_id="s"))
        assert journal.value.db_code == "file_replaced"  # type: ignore[attr-defined]
        assert not path.exists()  # no empty database left at the path for the next open to start over in
    finally:
        store.close()


def test_writes_after_another_file_is_moved_over_it_are_refused_and_leave_that_file_alone(
        tmp_path: Path, clock) -> None:
    path = tmp_path / "flows.db"
    store = fencepost.open(f"sqlite:///{path}", clock=clock)
    try:
        store.runs.create("before", "{}")
        _move_over(path, clock)
        with pytest.raises(fencepost.RunStoreError) as err:
            store.runs.create("stray", "{}")
        _assert_refused(err.value)
        _assert_refused(_create(store, "stray-too"))
        with sqlite3.connect(path) as other:
            ids = {r[0] for r in other.execute("SELECT run_id FROM flows_runs")}
        assert ids == {"from-the-other-file"}
    finally:
        store.close()
    # The moved-in database opens as a store of its own, untouched.
    with fencepost.open(f"sqlite:///{path}", clock=clock) as again:
        again.runs.create("after", "{}")
        assert {r.run_id for r in again.feed.iter_runs()} == {"from-the-other-file", "after"}


def test_a_store_whose_file_stays_put_writes_from_every_thread(tmp_path: Path, clock) -> None:
    """The check refuses nothing while the path names the store's own file (dispose and reconnect too)."""
    path = tmp_path / "flows.db"
    store = fencepost.open(f"sqlite:///{path}", clock=clock)
    try:
        store.runs.create("a", "{}")
        assert _create(store, "b") is None
        store.db.dispose()
        store.runs.create("c", "{}")
        os.utime(path)  # touched, not replaced
        assert _create(store, "d") is None
        assert {r.run_id for r in store.feed.iter_runs()} == {"a", "b", "c", "d"}
    finally:
        store.close()


def test_the_checkpoint_thread_does_not_create_a_database_where_the_file_was_deleted(
        tmp_path: Path, clock, monkeypatch) -> None:
    """The background checkpoint thread connected to the store's path with a plain connect, which
    creates a missing file: a file deleted before the thread's first pass (or before it reconnected
    after a failed one) came back as an empty database at the path. It now opens the file only if
    it exists, and the pass fails instead."""
    from fencepost import _checkpoint

    monkeypatch.setattr(_checkpoint, "INTERVAL_S", 0.5)  # the first pass connects this long after the write
    path = tmp_path / "flows.db"
    store = fencepost.open(f"sqlite:///{path}", clock=clock)
    try:
        checkpointer = store.db.backend.checkpointer
        store.runs.create("before", "{}")  # starts the thread; its first pass comes 0.5 s later
        assert checkpointer.passes == 0 and checkpointer.failures == 0
        _remove_database(path)
        from tests.conftest import eventually

        assert eventually(lambda: checkpointer.passes + checkpointer.failures > 0, timeout=10)
        assert checkpointer.failures == 1 and checkpointer.passes == 0
        assert not path.exists()
    finally:
        store.close()
