"""A process SIGKILLed in the middle of ``fencepost.open``'s migration pass, on both backends.

Covers the pair nothing else did: SIGKILL x migration on open (a fresh store, and an older store
with migrations pending). The pass is one write transaction, so the kill leaves nothing of it: no
table of a fresh store, the ledger and the columns of an older one exactly as they were. The next
open (another process's lock died with the killed one) migrates at once and writes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.pool import NullPool

import fencepost
from fencepost._durable import Database
from fencepost._migrations import STORE_NAMESPACES, discover
from tests.conftest import back_to_4001, ledger_of, require_postgres
from tests.faults.conftest import REPO, Peer

pytestmark = pytest.mark.slow


class Migrating:
    """A child process paused in the middle of its open's migration pass (``tests/faults/_migrating.py``)."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.faults._migrating", url],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO)
        self._reader = Peer.__new__(Peer)  # the peer's bounded line reader on this pipe
        self._reader.proc, self._reader._buf = self.proc, b""
        line = self.line()
        assert line.startswith("migrating "), "the child never reached the middle of its migration pass"
        self.backend_pid = int(line.split()[1])

    def line(self, timeout: float = 60) -> str:
        line = self._reader._line(timeout)
        assert line is not None, "the child did not answer"
        return line

    def go_on(self) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()
        return self.line()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def _kill_mid_migration(url: str) -> None:
    child = Migrating(url)
    try:
        child.proc.send_signal(signal.SIGKILL)
        assert child.proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        child.close()


def _tables(url: str, backend: str) -> set[str]:
    if backend == "sqlite":
        import sqlite3

        path = url[len("sqlite:///"):]
        with sqlite3.connect(path) as raw:
            return {n for (n,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    schema = url.rsplit("schema=", 1)[1]
    engine = create_engine(require_postgres(), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return set(conn.execute(text("SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                                    {"s": schema}).scalars())
    finally:
        engine.dispose()


def _membership_columns(url: str) -> set[str]:
    db = Database(url, readonly=True)
    try:
        return db.read(lambda conn: {c["name"] for c in inspect(conn).get_columns("flows_shard_membership")})
    finally:
        db.dispose()


def _open_and_write(url: str) -> float:
    started = time.monotonic()
    with fencepost.open(url) as store:
        store.runs.create("after", "{}")
        assert store.runs.get("after").status == "pending"
    return time.monotonic() - started


def test_sigkill_mid_migration_of_a_fresh_store_leaves_no_table(db_url: str, backend: str) -> None:
    _kill_mid_migration(db_url)
    assert _tables(db_url, backend) == set()  # not even the ledger: the pass committed nothing
    assert _open_and_write(db_url) < 10  # no lock left behind
    assert ledger_of(db_url) == {m.id for m in discover(backend, STORE_NAMESPACES)}


def test_sigkill_mid_pending_migrations_leaves_the_older_store_as_it_was(db_url: str, backend: str) -> None:
    with fencepost.open(db_url) as store:
        store.runs.create("kept", "{}")
    back_to_4001(db_url)
    before = ledger_of(db_url)
    assert "founded_at_ms" not in _membership_columns(db_url)
    _kill_mid_migration(db_url)  # killed after 4002 (the column) ran, before 4003 and the COMMIT
    assert ledger_of(db_url) == before
    assert "founded_at_ms" not in _membership_columns(db_url)  # the DDL was rolled back too
    assert _open_and_write(db_url) < 10
    assert ledger_of(db_url) == {m.id for m in discover(backend, STORE_NAMESPACES)}
    with fencepost.open(db_url) as store:
        assert store.runs.get("kept").status == "pending"


def test_backend_terminated_mid_migration_is_retried_by_the_same_open(pg_url: str) -> None:
    """Covers pg_terminate_backend x migration on open (PostgreSQL only: SQLite has no backend). The
    migrating session is terminated while the pass's transaction is open: the outcome is known
    (nothing committed), so the same ``fencepost.open`` call runs the pass again on a new connection
    and returns a fully migrated store; every migration is recorded once."""
    db_url, backend = pg_url, "postgresql"
    child = Migrating(db_url)
    try:
        assert child.backend_pid > 0
        engine = create_engine(require_postgres(), poolclass=NullPool)
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": child.backend_pid}).scalar()
        finally:
            engine.dispose()
        wanted = {m.id for m in discover(backend, STORE_NAMESPACES)}
        assert child.go_on() == f"finished {len(wanted)}"  # the same open, retried: no reopen
    finally:
        child.close()
    assert ledger_of(db_url) == wanted
    assert _open_and_write(db_url) < 10
