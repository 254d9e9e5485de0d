"""Reads after the SQLite file was replaced under an open store (a restore: ``mv``, or ``rm`` and ``cp``).

SQLite only by nature (a PostgreSQL store has no file; a dropped schema is the follower's
``SourceChanged``, tested with the follower). Defect: a store's connections hold the file they
opened, so after another file was moved over the path, or the file removed and a backup copied in,
every read went on answering from the old, unlinked file for as long as the store lived, and a
service reading from it (a projection builder's source) never noticed. Now each read transaction
compares the path's file (device, inode) with the one its connection opened: a read-only store
reconnects and reads the file now at the path; a writable store, which keeps to the file it opened,
refuses the read as it refuses writes (``file_replaced``) rather than answer from the old file.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

import fencepost
from tests.faults.test_replaced_database import _move_over, _remove_database


def _restore_by_copy(path: Path, clock) -> None:
    """``rm flows.db*; cp backup.db flows.db``: a new file (new inode) with other contents."""
    backup = path.with_name("backup.db")
    with fencepost.open(f"sqlite:///{backup}", clock=clock) as s:
        s.runs.create("from-the-other-file", "{}")
    _remove_database(path)
    shutil.copy(backup, path)


REPLACEMENTS = {"moved-over": _move_over, "removed-and-copied": _restore_by_copy}


def _ids(store: fencepost.Store) -> list[str]:
    return sorted(r.run_id for r in store.feed.iter_runs())


def _in_thread(fn):
    out: list = []
    t = threading.Thread(target=lambda: out.append(_try(fn)))
    t.start()
    t.join(60)
    return out[0]


def _try(fn):
    try:
        return fn()
    except fencepost.FencepostError as exc:
        return exc


@pytest.mark.parametrize("how", sorted(REPLACEMENTS))
def test_a_read_only_store_reads_the_file_now_at_its_path(tmp_path: Path, clock, how) -> None:
    path = tmp_path / "flows.db"
    with fencepost.open(f"sqlite:///{path}", clock=clock) as s:
        s.runs.create("before", "{}")
    store = fencepost.open(f"sqlite:///{path}", readonly=True, clock=clock)
    try:
        assert _ids(store) == ["before"]  # this thread keeps a read connection on the file
        assert _in_thread(lambda: _ids(store)) == ["before"]  # another connection, back in the pool
        REPLACEMENTS[how](path, clock)
        assert _ids(store) == ["from-the-other-file"]  # the kept connection
        assert _in_thread(lambda: _ids(store)) == ["from-the-other-file"]  # a pooled one
        assert store.runs.get("from-the-other-file").status == "pending"
        assert store.feed.position() is not None
    finally:
        store.close()


def test_a_read_only_store_whose_file_was_deleted_says_so(tmp_path: Path, clock) -> None:
    path = tmp_path / "flows.db"
    with fencepost.open(f"sqlite:///{path}", clock=clock) as s:
        s.runs.create("before", "{}")
    with fencepost.open(f"sqlite:///{path}", readonly=True, clock=clock) as store:
        assert _ids(store) == ["before"]
        _remove_database(path)
        err = _try(lambda: _ids(store))
        assert isinstance(err, fencepost.FencepostError), err
        assert err.db_code == "file_replaced", err  # type: ignore[attr-defined]
        assert "database file was deleted" in str(err) and "no file is at its path" in str(err), str(err)
        assert not path.exists()  # nothing created at the path
        # Put back, it is read again.
        _recreated = path.with_name("again.db")
        with fencepost.open(f"sqlite:///{_recreated}", clock=clock) as s:
            s.runs.create("again", "{}")
        shutil.copy(_recreated, path)
        assert _ids(store) == ["again"]


@pytest.mark.parametrize("how", sorted(REPLACEMENTS))
def test_a_writable_store_refuses_to_read_from_the_old_file(tmp_path: Path, clock, how) -> None:
    path = tmp_path / "flows.db"
    store = fencepost.open(f"sqlite:///{path}", clock=clock)
    try:
        store.runs.create("before", "{}")
        assert _ids(store) == ["before"]
        assert _in_thread(lambda: _ids(store)) == ["before"]
        REPLACEMENTS[how](path, clock)
        for err in (_try(lambda: _ids(store)), _in_thread(lambda: _ids(store))):
            assert isinstance(err, fencepost.FencepostError), err
            assert err.db_code == "file_replaced", err  # type: ignore[attr-defined]
    finally:
        store.close()
    with fencepost.open(f"sqlite:///{path}", clock=clock) as again:  # opened again: the file at the path
        assert _ids(again) == ["from-the-other-file"]


def test_reads_of_a_file_that_stays_put_never_reconnect(tmp_path: Path, clock) -> None:
    """The check replaces no connection while the path names the file it opened (touched, written)."""
    path = tmp_path / "flows.db"
    with fencepost.open(f"sqlite:///{path}", clock=clock) as writer, \
            fencepost.open(f"sqlite:///{path}", readonly=True, clock=clock) as reader:
        writer.runs.create("a", "{}")
        assert _ids(reader) == ["a"]
        kept = reader.db._slot(False).conn
        for i in range(20):
            writer.runs.create(f"b{i}", "{}")
            path.touch()
            assert len(_ids(reader)) == i + 2
        assert reader.db._slot(False).conn is kept
