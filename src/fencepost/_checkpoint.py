"""SQLite WAL checkpoints on a background thread instead of inside a writer's COMMIT.

A SQLite writer in WAL mode checkpoints by itself: the COMMIT that takes the log past 1000 pages
also copies the log into the database file and syncs both, and its caller waits for all of it
(tens of milliseconds, one commit in a few hundred). A store opened writable lets a thread of its
own do that work instead: a short while after writes, it runs a passive checkpoint on its own
connection. A passive checkpoint never blocks a writer or a reader, and it runs outside Python's
interpreter lock, so the writers go on meanwhile.

Durability does not depend on checkpoints: a committed transaction is in the log, synced as the
store's ``synchronous`` setting says, whether or not it was copied yet. A checkpoint that fails (a
full disk, a file made read-only) leaves the log as it was and is tried again after the next write.
Writers keep a backstop: a log past ``WRITER_BACKSTOP_PAGES`` pages is checkpointed by the writer
that takes it there, as SQLite does by default, so the log stays bounded when the thread cannot
keep up (writes back to back leave a passive checkpoint always a little behind, and the log only
starts over once a checkpoint has caught up).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

from opentelemetry import metrics

from fencepost._txn import PROCESS

log = logging.getLogger("fencepost.sqlite")
checkpoints = metrics.get_meter("fencepost").create_counter(
    "flows_sqlite_checkpoints",
    description="Background checkpoints of a SQLite store's log by outcome (done, busy, failed)")

#: Log pages at which a writer checkpoints by itself (SQLite's own default is 1000).
WRITER_BACKSTOP_PAGES = 4000
#: Seconds the thread lets writes gather before it checkpoints them.
INTERVAL_S = 0.1


class Checkpointer:
    """One background checkpoint thread per writable SQLite store (per process), started by a write."""

    # Set by ``_reset``: at creation, and again in a forked child.
    _lock: threading.Lock
    _thread: threading.Thread | None
    _wake: threading.Event
    _stop: threading.Event
    _pid: int

    def __init__(self, path: str, synchronous: str) -> None:
        self._path = path
        self._uri = Path(path).as_uri() + "?mode=rw"  # the store's path, absolute since it opened
        self._synchronous = synchronous
        self._reset()
        #: Checkpoints run and failed (read by tests and diagnostics).
        self.passes = 0
        self.failures = 0
        #: Set by the thread from taking a request to the end of the pass it asked for.
        self._in_pass = False

    def wrote(self) -> None:
        """A write committed: checkpoint soon. Called on every commit, so the usual case is one check."""
        if self._pid != PROCESS.pid:
            PROCESS.adopt(self, self._reset)
        elif self._wake.is_set():
            return
        # Never waited for: whoever holds the lock (another thread, or this thread's own call that a
        # signal handler writing here interrupted, which would wait for ever) asks for a pass as it
        # leaves, and that pass covers this commit too.
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._thread is None or not self._thread.is_alive():
                # The first write, or the first after ``close`` (or after the thread died).
                self._wake = threading.Event()
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._wake, self._stop),
                                                name="fencepost-checkpoint", daemon=True)
                self._thread.start()
            self._wake.set()
        finally:
            self._lock.release()

    def _reset(self) -> None:
        """Start from nothing: at creation, and in a forked child, where the parent's thread does
        not exist and its lock may have been held at the fork (it would never be released)."""
        self._lock = threading.Lock()
        self._thread = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pid = PROCESS.pid

    def close(self, wait: bool = True) -> None:
        """Stop the thread (a checkpoint under way finishes first); a later write starts a new one.

        ``wait=False`` only asks it to stop (for a store dropped without being closed: the garbage
        collector must not wait for a checkpoint).
        """
        if self._pid != PROCESS.pid:
            return  # a forked child that never wrote: the thread is its parent's
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._stop.set()
            self._wake.set()
            # Fresh events: the next write must not find "already asked" and skip starting a thread.
            self._wake = threading.Event()
            self._stop = threading.Event()
        if wait and thread is not threading.current_thread():
            thread.join(10)

    def idle(self, timeout: float) -> bool:
        """Wait until no checkpoint is asked for or under way (at most ``timeout`` seconds); whether
        it is so. For a benchmark, so that the copy of writes it timed is not done on the clock of
        what it times next; and for tests."""
        deadline = time.monotonic() + timeout
        while self.running and (self._wake.is_set() or self._in_pass):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and self._pid == PROCESS.pid

    def _run(self, wake: threading.Event, stop: threading.Event) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                wake.wait()
                if stop.wait(INTERVAL_S):
                    return
                self._in_pass = True  # before the request is cleared: ``idle`` sees one or the other
                wake.clear()  # before the checkpoint: a commit during it asks for the next one
                try:
                    if conn is None:
                        # Never creates the file: one deleted under the store must not come back
                        # as an empty database at its path (the pass fails instead).
                        conn = sqlite3.connect(self._uri, uri=True, isolation_level=None, check_same_thread=False)
                        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
                    busy = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0]
                    self.passes += 1
                    # Busy: another connection was checkpointing; what is left waits for the next pass.
                    checkpoints.add(1, {"outcome": "busy" if busy else "done"})
                except sqlite3.Error as exc:
                    # The log keeps every frame; the next write asks again. The code only: no values.
                    code = getattr(exc, "sqlite_errorname", None) or "no code"
                    self.failures += 1
                    checkpoints.add(1, {"outcome": "busy" if code == "SQLITE_BUSY" else "failed"})
                    log.debug("background checkpoint failed (%s)", code)
                    if conn is not None:
                        conn.close()
                        conn = None
                finally:
                    self._in_pass = False
        finally:
            if conn is not None:
                conn.close()
