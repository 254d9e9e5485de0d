"""One builder per projection name per target.

The lock lives as long as the builder's process or connection, never in a table row: a builder
killed with SIGKILL must not leave a lock that outlives it. PostgreSQL: a session advisory lock on a
dedicated autocommit connection outside the store's pool (released by the server when the connection dies). SQLite: an
``flock`` on a file beside the database (released by the kernel when the process dies; separate
opens conflict even inside one process).

A PostgreSQL server restart ends that connection's session and so the lock, with nothing said to
the builder. ``acquire`` therefore asks the connection of a lock it believes held whether it is
still there (one ``SELECT 1``), and takes the lock again on a new connection when it is not, or
says ``builder_busy`` when another builder took the name meanwhile.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import threading
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from fencepost._durable import Database, DbFailure, map_failure
from fencepost.errors import ProjectionError

_PG_TRY = text("SELECT pg_try_advisory_lock(hashtextextended(:key, 3001))")
_PG_UNLOCK = text("SELECT pg_advisory_unlock(hashtextextended(:key, 3001))")
_PG_ALIVE = text("SELECT 1")
_PG_KEEP_IDLE = text("SET idle_session_timeout = 0")


class BuilderLock:
    """Exclusive right to apply under one projection name on one target."""

    def __init__(self, target: Database, name: str) -> None:
        self._target = target
        self._name = name
        self._handle: Any = None
        self._mutex = threading.Lock()  # the threads of a builder of several sources share the handle
        self._closed = False  # released for good (its builder closed): never taken again
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:24]
        if target.backend.name == "sqlite":
            assert target.path is not None
            # Beside the file itself, not the name it was given by: a target reached through a
            # symbolic link (or a linked directory) is the same file, so its builders must meet
            # on one lock file. SQLite keeps its -wal and -shm beside the linked-to file too.
            self._path = f"{os.path.realpath(target.path)}.projection-{digest}.lock"
        else:
            self._key = f"fencepost.projection/{target.schema}/{name}"

    @property
    def held(self) -> bool:
        return self._handle is not None

    def acquire(self, timeout: float | None) -> None:
        """Take the lock, waiting up to ``timeout`` seconds (None: forever; 0: refuse at once).

        A lock already held is kept, unless its PostgreSQL session is gone: then it is taken again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._mutex:  # not held while waiting: ``release`` must not wait for another builder
                if self._closed:  # a write still under way in another thread must not take it again
                    raise ProjectionError("projection_failed", "acquire", "the builder is closed")
                if self._handle is not None and self._alive():
                    return
                if self._try():
                    return
            if deadline is not None and time.monotonic() >= deadline:
                busy = ProjectionError(
                    "builder_busy", "acquire",
                    f"another builder is applying projection {self._name!r} on {self._target.where}: stop it "
                    f"first (it holds the name until it is closed or its process exits), or give lock_timeout "
                    f"to wait for it"
                )
                busy.target = self._target.where  # the CLI says it in its own words
                raise busy
            time.sleep(0.05)

    def _alive(self) -> bool:
        """Whether the held lock's session is still there (an ``flock`` always is)."""
        handle = self._handle
        if isinstance(handle, int):
            return True
        try:
            handle.execute(_PG_ALIVE)
        except DBAPIError:
            self._handle = None
            handle.invalidate()  # the session, and the lock with it, ended on the server
            handle.close()
            return False
        return True

    def _try(self) -> bool:
        if self._target.backend.name == "sqlite":
            try:
                fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:  # read-only media, no permission, a full inode table ...
                reason: str | None = errno.errorcode.get(exc.errno or 0, "an OS error")
                # Waiting may cure running out of file handles (or an interrupted open), not the rest.
                transient = exc.errno in (errno.EINTR, errno.EAGAIN, errno.EMFILE, errno.ENFILE)
            else:
                reason = None
            if reason is not None:
                err = ProjectionError("persistence_failed", "acquire",
                                      f"projection target: cannot open the builder's lock file beside it ({reason})")
                err.transient = transient  # type: ignore[attr-defined]
                raise err
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self._handle = fd
            return True
        failure: DbFailure | None = None
        try:
            # Outside the pool (a detached connection): the builder keeps it for its whole life,
            # and the pool's connections are for transactions. It is taken from the pool as every
            # connection of the store is (threads' idle kept connections are reclaimed for it
            # when the pool has none left), then no longer counted against it.
            conn = self._target.detached_connection()
        except DBAPIError as exc:
            failure = self._target._failure(exc)
        except DbFailure as exc:  # the pool stayed exhausted, or the store is closed
            failure = exc
        if failure is not None:  # raised outside the handler: the driver's message quotes the URL
            raise map_failure(failure, ProjectionError, "acquire", "projection target")
        try:
            # Set on the driver: SQLAlchemy's isolation option registers its undo with the pool's
            # record of the connection, which a detached connection no longer has.
            raw = conn.connection.dbapi_connection
            assert raw is not None  # a new connection, open
            raw.autocommit = True
            if raw.info.server_version >= 140000:
                # The session sits idle between batches by design: a role's idle_session_timeout
                # would end it, and the lock with it, unseen until the next ``acquire``. Off for
                # this session alone (a user setting; the store's pooled sessions keep theirs).
                conn.execute(_PG_KEEP_IDLE)
            got = bool(conn.execute(_PG_TRY, {"key": self._key}).scalar())
        except DBAPIError as exc:
            conn.close()
            failure = self._target._failure(exc)
        except BaseException:
            conn.close()
            raise
        if failure is not None:
            raise map_failure(failure, ProjectionError, "acquire", "projection target")
        if not got:
            conn.close()
            return False
        self._handle = conn
        return True

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        with self._mutex:
            self._release()

    def close(self) -> None:
        """Give the lock up for good: ``acquire`` refuses from now on (idempotent)."""
        with self._mutex:
            self._closed = True
            self._release()

    def _release(self) -> None:
        handle, self._handle = self._handle, None
        if handle is None:
            return
        if isinstance(handle, int):
            try:
                fcntl.flock(handle, fcntl.LOCK_UN)
            finally:
                os.close(handle)
            return
        try:
            handle.execute(_PG_UNLOCK, {"key": self._key})
        except Exception:
            handle.invalidate()  # a dead connection released the lock already
        finally:
            handle.close()
