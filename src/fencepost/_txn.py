"""The transaction each thread or task has open on each database, and the process that opened it.

Both the durable writer and group commit consult these on every write, so they live apart from
either. The process id is kept rather than asked for: ``os.getpid()`` is a system call on every
read, and a write used to make four of them. A forked child refreshes it before any of its code runs.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable
from typing import Any


class _Process:
    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid = os.getpid()

    def forked(self) -> None:
        self.pid = os.getpid()


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
