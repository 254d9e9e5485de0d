"""Issue 10 defect 2: a follower notices that the database it follows was replaced.

SQLite: the file is deleted (with its ``-wal``/``-shm``) and a new store created at the same path,
or another database file is moved over it. The follower's connections still hold the old, unlinked
file, so its queries kept answering from it and it waited forever. Now it compares the path's file
identity (device, inode) with the one it started on, at every wake-up and every fallback poll, and
raises ``SourceChanged``; ``fencepost feed tail --follow`` exits non-zero with its one-line error.
PostgreSQL: the schema dropped and a new store created in it (a new source identity).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import fencepost
from fencepost import SourceChanged
from fencepost.changefeed import follow as follow_module
from tests.changefeed.test_follow import Follower
from tests.cli.conftest import fencepost_exe
from tests.conftest import drop_schema, require_postgres

POLL = 0.5


def _remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(f"{path}{suffix}")
        except FileNotFoundError:
            pass


def _recreate(path: Path, clock) -> None:
    with fencepost.open(f"sqlite:///{path}", clock=clock) as fresh:
        fresh.runs.create("in-the-new-store", "{}")


def _move_over(path: Path, clock) -> None:
    other = path.with_name("other.db")
    with fencepost.open(f"sqlite:///{other}", clock=clock) as s:
        s.runs.create("from-the-other-file", "{}")
    os.replace(other, path)
    for suffix in ("-wal", "-shm"):
        try:
            os.remove(f"{path}{suffix}")
        except FileNotFoundError:
            pass


REPLACEMENTS = {
    "deleted-and-recreated": lambda path, clock: (_remove_database(path), _recreate(path, clock)),
    "other-file-moved-over": _move_over,
    "deleted": lambda path, clock: _remove_database(path),
}


@pytest.fixture
def sqlite_store(tmp_path: Path, clock):
    path = tmp_path / "flows.db"
    store = fencepost.open(f"sqlite:///{path}", clock=clock)
    try:
        yield store, path
    finally:
        store.close()


def _wait_error(follower: Follower, timeout: float = 15.0) -> BaseException | None:
    deadline = time.monotonic() + timeout
    while follower.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return follower.error


@pytest.mark.parametrize("replacement", list(REPLACEMENTS), ids=list(REPLACEMENTS))
def test_follow_raises_source_changed_when_the_sqlite_file_is_replaced(sqlite_store, clock, replacement) -> None:
    store, path = sqlite_store
    store.runs.create("before", "{}")
    follower = Follower(store, poll_interval=POLL)
    try:
        follower.wait_for(lambda c: [x.run_id for x in c] == ["before"])
        REPLACEMENTS[replacement](path, clock)
        error = _wait_error(follower)
    finally:
        assert follower.close()
    assert isinstance(error, SourceChanged), error
    assert "replaced" in str(error) and str(path) not in str(error)
    assert follower.ids() == ["before"]  # nothing of the new file was handed out as the old store's


@pytest.mark.parametrize("replacement", ["deleted-and-recreated", "other-file-moved-over"])
def test_the_fallback_poll_alone_detects_the_replacement(sqlite_store, clock, monkeypatch, replacement) -> None:
    """With no file watcher at all (inotify unavailable), the fallback poll finds the new file."""
    monkeypatch.setattr(follow_module._SqliteWaiter, "_watch", lambda self, directory: None)
    store, path = sqlite_store
    store.runs.create("before", "{}")
    follower = Follower(store, poll_interval=POLL)
    try:
        follower.wait_for(lambda c: len(c) == 1)
        REPLACEMENTS[replacement](path, clock)
        error = _wait_error(follower)
    finally:
        assert follower.close()
    assert isinstance(error, SourceChanged), error


def test_afollow_raises_source_changed_when_the_sqlite_file_is_replaced(sqlite_store, clock) -> None:
    store, path = sqlite_store
    store.runs.create("before", "{}")

    async def main() -> list[str]:
        seen: list[str] = []
        async for change in store.feed.afollow(poll_interval=POLL):
            seen.append(change.run_id)
            await asyncio.to_thread(REPLACEMENTS["deleted-and-recreated"], path, clock)
        return seen

    with pytest.raises(SourceChanged):
        asyncio.run(asyncio.wait_for(main(), 15))


def test_a_follower_of_an_untouched_file_keeps_following(sqlite_store, clock) -> None:
    """The identity check does not fire on ordinary commits, checkpoints or WAL resets."""
    store, path = sqlite_store
    follower = Follower(store, poll_interval=POLL)
    try:
        for i in range(5):
            store.runs.create(f"r{i}", "{}")
            with sqlite3.connect(path) as other:  # a checkpoint that truncates the WAL file
                other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        follower.wait_for(lambda c: len(c) == 5)
        time.sleep(POLL * 3)
        assert follower.error is None
    finally:
        assert follower.close()


def test_cli_feed_tail_follow_exits_non_zero_when_the_file_is_replaced(tmp_path: Path, clock) -> None:
    path = tmp_path / "flows.db"
    with fencepost.open(f"sqlite:///{path}", clock=clock) as s:
        s.runs.create("before", "{}")
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    proc = subprocess.Popen([fencepost_exe(), "--db", f"sqlite:///{path}", "feed", "tail", "--follow", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert json.loads(proc.stdout.readline())["run_id"] == "before"
        _remove_database(path)
        _recreate(path, clock)
        code = proc.wait(timeout=20)  # the CLI polls every 2 s; the watcher wakes it sooner
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert "replaced" in lines[0]
    # Said in the tailer's terms, as a rotation is: what happened and how to start again. It was the
    # library's "invalid_run: RunStore.follow: ... under the follower: rebuild".
    assert "--from 0" in lines[0] and "invalid_run" not in lines[0] and "rebuild" not in lines[0], lines[0]
    assert str(path) not in lines[0]


# ----------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def pg_url():
    base = require_postgres()
    schema = "t_" + uuid.uuid4().hex[:16]
    yield f"{base}?schema={schema}", base, schema
    drop_schema(base, schema)


def test_follow_raises_source_changed_when_the_postgresql_schema_is_recreated(pg_url, clock) -> None:
    """The analogue on PostgreSQL: the store's schema dropped and a new store created in it. The
    follower rides out the moment the tables are gone and then sees a new source identity."""
    url, base, schema = pg_url
    store = fencepost.open(url, clock=clock)
    try:
        store.runs.create("before", "{}")
        follower = Follower(store, poll_interval=POLL)
        try:
            follower.wait_for(lambda c: len(c) == 1)
            engine = create_engine(base, poolclass=NullPool)
            with engine.connect() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
                conn.commit()
            engine.dispose()
            time.sleep(POLL * 2)  # the follower meets the missing tables at least once
            with fencepost.open(url, clock=clock) as fresh:
                fresh.runs.create("in-the-new-store", "{}")
            error = _wait_error(follower)
        finally:
            assert follower.close()
        assert isinstance(error, SourceChanged), error
        assert follower.ids() == ["before"]
    finally:
        store.close()


def test_threads_are_not_left_behind(sqlite_store, clock) -> None:
    """A follower that raised SourceChanged has stopped its watcher thread."""
    store, path = sqlite_store

    def watchers() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "fencepost-follow-watch" and t.is_alive())

    before = watchers()
    store.runs.create("before", "{}")
    follower = Follower(store, poll_interval=POLL)
    follower.wait_for(lambda c: len(c) == 1)
    assert watchers() == before + 1
    REPLACEMENTS["deleted-and-recreated"](path, clock)
    assert isinstance(_wait_error(follower), SourceChanged)
    assert follower.close()
    deadline = time.monotonic() + 5
    while watchers() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watchers() == before
