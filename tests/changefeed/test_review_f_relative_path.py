"""Defect (found by a review, SQLite): a store opened with a relative path (``sqlite:///r.db``; the
default ``sqlite:///.flows/flows.db`` is relative) whose process then changed directory had its
``follow()`` raise ``SourceChanged`` ("the database file was replaced or removed ... rebuild"):
the follower resolved the stored relative path against the new current directory, found no file
(or another one) there, and told the consumer to rebuild from 0 for nothing. New connections of
the store itself would likewise have opened (or created) the file relative to the new directory.

Now the path is made absolute once, when the store opens, and everything that resolves it later
(the engine's connections, file identity checks, the follower's watcher, the checkpointer) uses
that. SQLite only: a PostgreSQL store has no path.
"""

from __future__ import annotations

import threading

import fencepost


def _open_relative_then_move(tmp_path, monkeypatch) -> fencepost.Store:
    home = tmp_path / "home"
    elsewhere = tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(home)
    store = fencepost.open("sqlite:///r.db")
    store.runs.create("before", "{}")
    monkeypatch.chdir(elsewhere)
    return store


def test_follow_after_a_chdir_reads_the_store_it_opened(tmp_path, monkeypatch):
    store = _open_relative_then_move(tmp_path, monkeypatch)
    try:
        stop = threading.Event()
        seen: list[str] = []
        for change in store.feed.follow(None, stop=stop, poll_interval=0.05):
            seen.append(change.run_id)
            if change.run_id == "before":
                store.runs.create("after", "{}")
            if change.run_id == "after":
                stop.set()
        assert seen == ["before", "after"]
        assert store.feed.read(["after"]).snapshots[0].run_id == "after"
        assert store.db.where == "r.db"  # messages still name the path as it was given
    finally:
        store.close()
    assert not list((tmp_path / "elsewhere").iterdir())  # nothing was created in the new directory


def test_new_connections_after_a_chdir_open_the_store_file(tmp_path, monkeypatch):
    store = _open_relative_then_move(tmp_path, monkeypatch)
    try:
        store.db.dispose()  # every later connection is a new one, opened after the chdir
        store.runs.create("after", "{}")
        assert store.runs.get("before") is not None and store.runs.get("after") is not None
        batch = next(store.feed.follow_batches(None, poll_interval=0.05))
        assert [c.run_id for c in batch.changes] == ["before", "after"]
    finally:
        store.close()
    assert not list((tmp_path / "elsewhere").iterdir())
    monkeypatch.chdir(tmp_path / "home")
    again = fencepost.open("sqlite:///r.db", readonly=True)
    try:
        assert again.runs.get("after") is not None
    finally:
        again.close()
