"""An "in-memory" store for tests: the real SQL on a RAM-backed SQLite file, driven by a ``ManualClock``.

``memory_store()`` opens a fresh SQLite database in a new temporary directory, placed in
``/dev/shm`` (RAM-backed on Linux) when it exists and is writable, else in the system temp
directory. It is a real fencepost database: the same migrations, triggers and statements as any
other SQLite store, not a re-implementation in Python; only the file lives in memory. A pure
``:memory:`` SQLite database cannot serve here, because the store keeps a pool of connections and
each would see its own empty database. ``close()`` disposes the connections and removes the
directory::

    from fencepost.testing import memory_store

    with memory_store() as store:
        store.runs.create("run-1", "{}")
        store.clock.advance(31_000)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from fencepost._durable import Database
from fencepost._migrations import migrate
from fencepost._store import Store
from fencepost.clock import Clock, ManualClock

__all__ = ["ManualClock", "MemoryStore", "memory_store"]


def _ram_dir() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


class MemoryStore(Store):
    """A ``Store`` whose database lives in a temporary RAM-backed directory, removed on ``close``."""

    clock: Clock

    def __init__(self, directory: str, db: Database, **kwargs: Any) -> None:
        self.directory = directory
        super().__init__(db, **kwargs)

    def close(self) -> None:
        """Dispose every connection and delete the database directory."""
        try:
            super().close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


def memory_store(*, clock: Clock | None = None, attempt_policy: Any = None, consensus: Any = None,
                 synchronous: str = "OFF") -> MemoryStore:
    """Open a fresh, migrated store on a RAM-backed SQLite file; ``clock`` defaults to ``ManualClock(0)``.

    ``synchronous`` defaults to ``OFF``: the file is in memory, so there is nothing to make durable.
    """
    directory = tempfile.mkdtemp(prefix="fencepost-", dir=_ram_dir())
    try:
        db = Database(f"sqlite:///{os.path.join(directory, 'flows.db')}?synchronous={synchronous}")
        migrate(db)
        return MemoryStore(directory, db, clock=clock if clock is not None else ManualClock(0),
                           attempt_policy=attempt_policy, consensus=consensus)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
