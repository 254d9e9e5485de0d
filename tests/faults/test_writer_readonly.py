"""A SQLite file that turns read-only under a live store, then writable again.

SQLite opens a file it may not write silently read-only, and such a connection stays read-only
for good. A thread whose connection was opened while the file was read-only must get a new one
once the file is writable again, not fail for the life of the Store.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

import pytest

import fencepost
from tests.faults.conftest import unprivileged

pytestmark = pytest.mark.slow


def _scenario(path: str) -> dict:
    store = fencepost.open(f"sqlite:///{path}")
    out: dict = {}
    try:
        store.runs.create("before", "{}")
        os.chmod(path, 0o444)
        seen: list = []

        def writer(run_ids: list[str], gate: threading.Event, go_on: threading.Event) -> None:
            for n, run_id in enumerate(run_ids):
                if n == 1:
                    gate.set()
                    go_on.wait(30)
                try:
                    store.runs.create(run_id, "{}")
                    seen.append((run_id, "ok", None))
                except fencepost.RunStoreError as exc:
                    seen.append((run_id, exc.code, exc.db_code))  # type: ignore[attr-defined]

        gate, go_on = threading.Event(), threading.Event()
        # A new thread: its connection is opened now, while the file is read-only.
        t = threading.Thread(target=writer, args=(["while-ro", "after-ro"], gate, go_on))
        t.start()
        assert gate.wait(30)
        raw = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            raw.execute("PRAGMA journal_mode")  # reads only; the lock test is below, once writable
        finally:
            raw.close()
        os.chmod(path, 0o644)
        restored = time.monotonic()
        go_on.set()
        t.join(30)
        out["seen"] = seen
        out["recovered_s"] = time.monotonic() - restored
        # No write lock left behind by the failure: another connection takes it at once.
        raw = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("ROLLBACK")
            out["lock_free"] = True
        except sqlite3.OperationalError:
            out["lock_free"] = False
        finally:
            raw.close()
        out["ids"] = sorted(r for r in ("before", "while-ro", "after-ro") if _exists(store, r))
    finally:
        store.close()
    return out


def _exists(store: fencepost.Store, run_id: str) -> bool:
    try:
        store.runs.get(run_id)
    except fencepost.RunStoreError:
        return False
    return True


def test_a_file_turned_read_only_then_writable_again() -> None:
    home = Path(tempfile.mkdtemp(prefix="fencepost-roflip-"))
    try:
        os.chmod(home, 0o777)
        path = home / "flows.db"
        # Import what the scenario needs first: the unprivileged child may not read the
        # interpreter's library. Then run it as an unprivileged user (root ignores file modes).
        with fencepost.open(f"sqlite:///{home / 'warm.db'}") as warm:
            warm.runs.create("w", "{}")
            assert _exists(warm, "w") and not _exists(warm, "x")
        result = unprivileged(_scenario, str(path))
        assert result["seen"] == [("while-ro", "persistence_failed", "SQLITE_READONLY"), ("after-ro", "ok", None)]
        assert result["lock_free"]
        assert result["ids"] == ["after-ro", "before"]
    finally:
        shutil.rmtree(home, ignore_errors=True)
