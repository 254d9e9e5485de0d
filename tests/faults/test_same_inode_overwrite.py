"""Another database copied over a SQLite store's file in place (``cp other.db flows.db``).

A carried finding: a writable store notices its file deleted, or another file moved over its path
(``file_replaced``, by the file's device and inode), but not another database's bytes written into
the same inode. This is a documented limitation, not a defect we fix: nothing cheap tells such a
copy apart. The path still names the same file; in WAL mode the database header changes with
every checkpoint of any process on the file, and a query for the store's identity (its change-feed
source) is answered from the store's own write-ahead log while that row's page is there (and costs
more than the whole append path's budget for this check). The safe procedure, documented beside
``file_replaced``: close every store on the file, so its ``-wal`` log is gone, then replace the file.

SQLite only: a PostgreSQL store has no file to copy over.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import fencepost


def _make(path: Path, prefix: str, n: int) -> str:
    """A store at ``path`` with runs ``prefix-0..n-1``, closed; its change-feed source."""
    with fencepost.open(f"sqlite:///{path}") as store:
        for i in range(n):
            store.runs.create(f"{prefix}-{i}", "{}")
        return store.feed.position().source


def _run_ids(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return [r[0] for r in conn.execute("SELECT run_id FROM flows_runs ORDER BY run_id")]
    finally:
        conn.close()


def test_a_database_copied_over_the_open_file_in_place_goes_unnoticed(tmp_path: Path) -> None:
    """Pinned limitation: the same inode, other bytes; the open store's next write is not refused
    (it would be, had the copy been moved over the path). What the store reads afterwards mixes its
    own log with the copied file, so the test pins only that nothing reports ``file_replaced``."""
    path, other = tmp_path / "flows.db", tmp_path / "other.db"
    _make(other, "other", 2)
    store = fencepost.open(f"sqlite:///{path}")
    try:
        store.runs.create("mine-0", "{}")
        inode = os.stat(path).st_ino
        shutil.copyfile(other, path)  # cp other.db flows.db: written into the same inode
        assert os.stat(path).st_ino == inode
        store.runs.create("after", "{}")  # not refused: the overwrite is not detected
        store.feed.position()
    finally:
        store.close()


def test_closing_every_store_first_makes_replacing_the_file_safe(tmp_path: Path) -> None:
    """The documented procedure: close every store on the file (its ``-wal`` log is then gone),
    copy the other database over it, open again: the store is exactly the copied database."""
    path, other = tmp_path / "flows.db", tmp_path / "other.db"
    _make(path, "mine", 3)
    other_source = _make(other, "other", 2)
    assert not Path(f"{path}-wal").exists()  # closed: nothing of the store is left in a log
    shutil.copyfile(other, path)
    with fencepost.open(f"sqlite:///{path}") as store:
        assert store.feed.position().source == other_source
        assert store.runs.get("other-1").run_id == "other-1"
        store.runs.create("after", "{}")
    assert _run_ids(path) == ["after", "other-0", "other-1"]
