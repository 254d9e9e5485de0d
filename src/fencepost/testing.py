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
from typing import Any, Generic, Self, TypeVar, overload

from sqlalchemy import event

from fencepost._durable import Database
from fencepost._migrations import migrate
from fencepost._store import Store, check_parts
from fencepost.clock import Clock, ManualClock

__all__ = ["ManualClock", "MemoryStore", "limit_pages", "memory_store"]


def _ram_dir() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


C = TypeVar("C", bound=Clock)


class MemoryStore(Store, Generic[C]):
    """A ``Store`` whose database lives in a temporary RAM-backed directory, removed on ``close``.

    Generic in its clock, so a type checker knows ``memory_store().clock`` is the ``ManualClock``
    a test advances (``store.clock.advance(31_000)``), also inside ``with``.
    """

    clock: C

    def __init__(self, directory: str, db: Database, **kwargs: Any) -> None:
        self.directory = directory
        super().__init__(db, **kwargs)

    def __enter__(self) -> Self:
        return self

    def close(self) -> None:
        """Dispose every connection and delete the database directory."""
        try:
            super().close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


@overload
def memory_store(*, clock: None = None, attempt_policy: Any = None, consensus: Any = None,
                 synchronous: str = "OFF") -> MemoryStore[ManualClock]: ...


@overload
def memory_store(*, clock: C, attempt_policy: Any = None, consensus: Any = None,
                 synchronous: str = "OFF") -> MemoryStore[C]: ...


def memory_store(*, clock: Clock | None = None, attempt_policy: Any = None, consensus: Any = None,
                 synchronous: str = "OFF") -> MemoryStore[Any]:
    """Open a fresh, migrated store on a RAM-backed SQLite file; ``clock`` defaults to ``ManualClock(0)``.

    ``synchronous`` defaults to ``OFF``: the file is in memory, so there is nothing to make durable.
    A ``clock`` without ``now_ms`` or a ``consensus`` that is not a strategy is a ``ValueError``
    before anything is created, as for ``fencepost.open``.
    """
    check_parts(clock, consensus, "memory_store")
    directory = tempfile.mkdtemp(prefix="fencepost-", dir=_ram_dir())
    try:
        db = Database(f"sqlite:///{os.path.join(directory, 'flows.db')}?synchronous={synchronous}")
        migrate(db)
        return MemoryStore(directory, db, clock=clock if clock is not None else ManualClock(0),
                           attempt_policy=attempt_policy, consensus=consensus)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise


# SQLite's own ceiling on max_page_count: "no limit".
_NO_PAGE_LIMIT = 4294967294


def limit_pages(store: Store, pages: int | None) -> None:
    """Fault-injection hook: cap a SQLite store's database at ``pages`` pages, or lift the cap (``None``).

    Sets ``PRAGMA max_page_count`` on every connection of the store, the ones threads keep between
    transactions and the ones opened later, so a write that needs the database file to grow fails
    with ``SQLITE_FULL`` as on a full disk (SQLite never sets the cap below the current size, so
    ``0`` means "not one page more"). A write that fits in pages the file already has still
    succeeds. For tests of full-disk handling where mounting a small filesystem is not possible;
    it changes nothing on disk and ends with the store's connections or with ``limit_pages(store, None)``.
    """
    if not isinstance(store, Store):
        hint = "; pass one member store, shards[name]" if type(store).__name__ == "ShardSet" else ""
        raise ValueError(f"limit_pages: store must be a fencepost Store, not {type(store).__name__}{hint}")
    db = store.db
    if db.backend.name != "sqlite":
        raise ValueError("limit_pages applies to SQLite stores only")
    if pages is not None and (type(pages) is not int or pages < 0):
        raise ValueError("pages must be a non-negative integer or None")
    # SQLite reads a cap of 0 as a query, and raises any cap to the current size itself.
    limit = _NO_PAGE_LIMIT if pages is None else max(pages, 1)
    previous = getattr(db, "_page_limit_listener", None)
    if previous is not None:
        event.remove(db.engine, "checkout", previous)
        db._page_limit_listener = None  # type: ignore[attr-defined]

    def apply(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.execute(f"PRAGMA max_page_count = {int(limit)}")

    if pages is not None:
        event.listen(db.engine, "checkout", apply)
        db._page_limit_listener = apply  # type: ignore[attr-defined]
    with db._slots_lock:
        slots = list(db._slots)
    for slot in slots:
        if not slot.conn.closed and not slot.conn.invalidated:
            apply(slot.conn.connection.dbapi_connection)
