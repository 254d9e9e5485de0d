"""The transaction each thread or task has open on each database, and the process that opened it.

Both the durable writer and group commit consult these on every write, so they live apart from
either. The process id is kept rather than asked for: ``os.getpid()`` is a system call on every
read, and a write used to make four of them. A forked child refreshes it before any of its code runs.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable
from typing import Any


class _Process:
    """This process's id, and ``lock``: held while an object resets the per-process state it
    inherited across ``fork()`` (see ``adopt``). Both are renewed in a forked child before any of
    its code runs, so a lock a parent's thread held at the fork is never the child's."""

    __slots__ = ("lock", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()

    def forked(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()

    def adopt(self, owner: Any, reset: Callable[[], None]) -> None:
        """Once per process: ``reset()`` when ``owner._pid`` is another process's (a forked child's
        first call). Two threads making their first call at once must not both reset (one would
        lose what the other set up, or enter a lock the other replaced): the first resets under
        ``lock``, the others wait for it and find it done. ``reset`` sets ``owner._pid`` last."""
        if owner._pid == self.pid:
            return
        with self.lock:
            if owner._pid != self.pid:
                reset()


PROCESS = _Process()
os.register_at_fork(after_in_child=PROCESS.forked)


class Txn:
    """A transaction open on a database's connection in this thread or task."""

    __slots__ = ("after_commit", "conn", "pid", "write")

    def __init__(self, conn: Any, write: bool) -> None:
        self.conn = conn
        self.write = write
        self.after_commit: list[Callable[[], None]] = []
        # The process that opened it: a child forked inside a transaction must not join it.
        self.pid = PROCESS.pid


# id(Database) -> its open transaction, for the current thread or task.
current: contextvars.ContextVar[dict[int, Txn] | None] = contextvars.ContextVar("fencepost_txn", default=None)
