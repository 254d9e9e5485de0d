"""A writer killed while it holds the write lock, and (PostgreSQL) its backend killed instead.

SIGKILL gives the process no chance to roll back: SQLite's lock is a file lock the kernel drops
with the process, PostgreSQL's advisory lock dies with the session when the server sees the
socket close. Either way another process writes within the bound, and nothing the killed writer
had written inside its transaction is visible.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

import fencepost
from tests.faults.conftest import RECOVERY_BOUND_S, REPO, Peer, assert_nothing_of, assert_once, record

pytestmark = pytest.mark.slow


class Holder:
    def __init__(self, url: str, run_id: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.faults._holder", url, run_id],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO)
        self._reader = Peer.__new__(Peer)  # reuse the peer's bounded line reader on our pipe
        self._reader.proc = self.proc
        self._reader._buf = b""

    def line(self, timeout: float = 60) -> str:
        line = self._reader._line(timeout)
        assert line is not None, "the holder did not answer"
        return line

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def _peer_blocks(other: Peer) -> bool:
    """True when a peer write cannot finish within half a second (the lock is really held)."""
    try:
        other.write(timeout=0.5)
    except AssertionError:
        return True
    return False


def test_sigkill_of_a_writer_holding_the_write_lock(db_url: str, backend: str, peer) -> None:
    store = fencepost.open(db_url)  # opened before the kill; must keep working after it
    other = peer(db_url)
    holder = Holder(db_url, "held")
    try:
        since = store.feed.position()
        assert holder.line().startswith("holding")
        assert _peer_blocks(other), "the holder does not hold the write lock"
        holder.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        holder.proc.wait(timeout=10)
        # The peer's blocked write goes through once the lock is gone...
        assert other._line(5) is not None, "the write lock outlived the killed writer"
        waited = time.monotonic() - killed
        # ...and a new write is quick, from the peer and from this process's store.
        assert other.write(timeout=5) < RECOVERY_BOUND_S
        store.runs.create("after", "{}")
        record("SIGKILL of the writer holding the lock", backend, "(killed process) peer blocked until the kill",
               time.monotonic() - killed)
        assert_nothing_of(store, "held", since)
        assert store.runs.get("after").status == "pending"
        assert waited < 5
    finally:
        holder.close()
        store.close()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_terminated_backend_of_a_live_writer_holding_the_advisory_lock(db_url: str, peer) -> None:
    """The writer process lives on; its backend is terminated while it holds the lock."""
    store = fencepost.open(db_url)
    other = peer(db_url)
    holder = Holder(db_url, "held")
    try:
        pid = int(holder.line().split()[1])
        assert _peer_blocks(other), "the holder does not hold the write lock"
        conn = store.db.connect()
        try:
            assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid})").scalar() is True
            conn.commit()
        finally:
            conn.close()
        # The blocked peer write above finishes once the lock is gone; then a new one is quick.
        terminated = time.monotonic()
        assert other._line(5) is not None
        record("backend of a live lock holder terminated", "postgresql", "holder: nothing (retried once)",
               time.monotonic() - terminated)
        assert other.write(timeout=5) < RECOVERY_BOUND_S
        # The holder goes on: its next statement fails, the writer retries on a new connection.
        holder.proc.stdin.write(b"go\n")
        holder.proc.stdin.flush()
        assert holder.line() == "done 2"
        assert_once(store, "held")
    finally:
        holder.close()
        store.close()
