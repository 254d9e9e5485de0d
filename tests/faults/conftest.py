"""Fault-suite fixtures: real faults, and the witnesses that prove the store recovered from them.

- ``peer``: another process with its own store on the same database, which writes on command and
  reports how long the write took. A write lock left held by the faulted store shows up as a peer
  that blocks (it never answers within the bound).
- ``small_disk``: a real full disk for SQLite. A small ``tmpfs`` mounted for the test when we are root
  and ``mount`` is permitted; otherwise ``fencepost.testing.limit_pages`` (``PRAGMA max_page_count``
  on every connection of the store), so the suite still runs where mounting is refused.
- ``private_server``: a private PostgreSQL instance (``initdb`` + ``pg_ctl``) that may be restarted;
  the shared test server is never touched.
- ``full_disk_server``, ``wal_full_server``: a private PostgreSQL instance whose tables, or whose log
  (``pg_wal``), live on a small tmpfs (a real full disk for the server: ``fill()``, ``free()``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import fencepost
from tests.changefeed.test_follow_server_restart import PrivateServer, started_private
from tests.cli.conftest import run_cli  # noqa: F401 - the CLI fixture, for the CLI fault tests
from tests.conftest import run_forked, run_in_background

REPO = Path(__file__).resolve().parents[2]
# The bound on "another process writes once the fault is gone" (the 1 s).
RECOVERY_BOUND_S = 1.0


class Peer:
    """A second process writing to the same store (see ``tests/faults/_peer.py``)."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults._peer", url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO,
        )
        self._buf = b""
        line = self._line(60)
        assert line == "ready", f"peer did not start: {line!r}"

    def _line(self, timeout: float) -> str | None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def write(self, run_id: str | None = None, *, timeout: float = 10.0) -> float:
        """Create a run from the peer; return the seconds the write took there (fails if it blocks)."""
        run_id = run_id or f"peer-{uuid.uuid4().hex[:8]}"
        assert self.proc.stdin is not None
        self.proc.stdin.write(run_id.encode() + b"\n")
        self.proc.stdin.flush()
        line = self._line(timeout)
        assert line is not None, f"the peer's write did not return within {timeout} s (a lock left held?)"
        reply = json.loads(line)
        assert reply["ok"], f"the peer's write failed: {reply['error']}"
        return float(reply["elapsed"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def peer() -> Iterator:
    """A factory: ``peer(url)`` starts another writing process on ``url`` (killed at teardown)."""
    made: list[Peer] = []

    def start(url: str) -> Peer:
        p = Peer(url)
        made.append(p)
        return p

    yield start
    for p in made:
        p.close()


def _can_mount() -> bool:
    # FENCEPOST_TEST_NO_MOUNT=1 forces the page-cap fallback (to exercise it where mounting works).
    if os.environ.get("FENCEPOST_TEST_NO_MOUNT") == "1" or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    probe = Path(f"/tmp/fencepost-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", str(probe)], check=True, capture_output=True)
        return ok
    finally:
        probe.rmdir()


class SmallDisk:
    """A directory on a small filesystem that the test fills and frees at will."""

    def __init__(self, root: Path, mounted: bool) -> None:
        self.root = root
        self.mounted = mounted
        self._ballast = root / "ballast"
        self._store = None

    def url(self, name: str = "flows.db") -> str:
        return f"sqlite:///{self.root / name}"

    def fill(self, store, *, keep_log: bool = False) -> None:
        """Leave no free space for ``store``'s next write (its WAL is checkpointed away first,
        unless ``keep_log``: then the log's file keeps the room it has, only the disk is full)."""
        if not self.mounted:
            from fencepost.testing import limit_pages

            limit_pages(store, 0)
            self._store = store
            return
        import sqlite3

        assert store.db.path is not None
        if not keep_log:
            with sqlite3.connect(store.db.path) as raw:
                raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        fill_file(self._ballast)

    def fill_leaving(self, room: int) -> None:
        """Leave about ``room`` bytes free on the disk (mounted only: a page cap has no such room)."""
        assert self.mounted, "fill_leaving needs the tmpfs"
        fill_file(self._ballast)
        if room:
            os.truncate(self._ballast, max(0, self._ballast.stat().st_size - room))

    def free(self) -> None:
        """Give the space back."""
        if not self.mounted:
            from fencepost.testing import limit_pages

            if self._store is not None:
                limit_pages(self._store, None)
            return
        self._ballast.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 4 MiB tmpfs when we may mount one; else a plain directory and the page-limit hook."""
    if not _can_mount():
        yield SmallDisk(tmp_path, mounted=False)
        return
    root = Path(f"/tmp/fencepost-disk-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)], check=True, capture_output=True)
    try:
        yield SmallDisk(root, mounted=True)
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    """A private PostgreSQL instance this test may restart or stop."""
    with started_private(PrivateServer, "fencepost-pg", "the restart test") as server:
        yield server


class _OnSmallDisk(PrivateServer):
    """A private PostgreSQL instance with part of its files on a small tmpfs (``self.disk``) the
    test fills and frees."""

    disk: Path | None = None

    def _mount(self, size: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        self.disk = self.root / "small"
        self.disk.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.disk)],
                       check=True, capture_output=True)
        shutil.chown(self.disk, "postgres", "postgres")
        self._ballast = self.disk / "ballast"
        return self.disk

    def fill(self) -> None:
        """Leave no free space on the small disk."""
        fill_file(self._ballast)

    def free(self) -> None:
        """Give the space back."""
        self._ballast.unlink(missing_ok=True)

    def stop(self) -> None:
        super().stop()
        if self.disk is not None:
            subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)


class SmallTablespaceServer(_OnSmallDisk):
    """Its default tablespace (every table and index fencepost creates) is on the small disk; its
    log (``pg_wal``) stays on the ordinary disk, so the server keeps running while tables cannot grow."""

    def init(self) -> None:
        super().init()
        space = self._mount("8m") / "space"
        space.mkdir()
        shutil.chown(space, "postgres", "postgres")
        from sqlalchemy import create_engine

        engine = create_engine(self.url.split("?")[0], isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f"CREATE TABLESPACE small LOCATION '{space}'")
                conn.exec_driver_sql("ALTER DATABASE postgres SET default_tablespace = small")
        finally:
            engine.dispose()


class SmallWalServer(_OnSmallDisk):
    """Its log (``pg_wal``, in 1 MiB segments) is on the small disk: a full disk there fails the
    server's log write, which PostgreSQL answers with a PANIC (and, with no room to recover in, a
    shutdown: ``running()`` says, ``start()`` starts it again)."""

    def init(self) -> None:
        if self.as_postgres:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.chown(self.root, "postgres", "postgres")
        wal = self._mount("24m") / "pg_wal"
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync",
                  "--wal-segsize=1", "-X", str(wal))
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("min_wal_size = 4MB\nmax_wal_size = 8MB\n")
        self.start()

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


@pytest.fixture
def full_disk_server() -> Iterator[SmallTablespaceServer]:
    """A private PostgreSQL instance whose tables live on a small tmpfs (``fill()``/``free()``);
    skips where a filesystem cannot be mounted."""
    if not _can_mount():
        pytest.skip("mounting a filesystem needs root and a permitted mount")
    with started_private(SmallTablespaceServer, "fencepost-pgdisk", "the PostgreSQL full-disk test") as server:
        yield server


@pytest.fixture
def wal_full_server() -> Iterator[SmallWalServer]:
    """A private PostgreSQL instance whose log (``pg_wal``) lives on a small tmpfs (``fill()``/``free()``);
    skips where a filesystem cannot be mounted."""
    if not _can_mount():
        pytest.skip("mounting a filesystem needs root and a permitted mount")
    with started_private(SmallWalServer, "fencepost-pgwal", "the PostgreSQL full-log test") as server:
        yield server


# --------------------------------------------------------------------------- witnesses


# Big enough that the database file must grow to hold it (so a page cap fails it, as a full disk does).
BIG_STATE = '{"blob": "' + "x" * 65536 + '"}'


def composite(store, run_id: str, extra=None, state: str = '{"step": 1}'):
    """One transaction that writes a run, a journal entry and (``extra(conn)``) the faulting statement."""

    def body(tx):
        store.runs.create(run_id, state)
        tx.append_unfenced(run_id, "made", {"n": 1}, source_id="fault-suite")
        if extra is not None:
            extra(tx.conn)
        return run_id

    return store.journal.transact(body)


def _counts(store, run_id: str) -> tuple[int, int]:
    """(run rows, journal entries) for ``run_id``, read raw."""
    from sqlalchemy import text

    def read(conn):
        runs = conn.execute(text("SELECT count(*) FROM flows_runs WHERE run_id = :i"), {"i": run_id}).scalar()
        entries = conn.execute(
            text("SELECT count(*) FROM flows_journal_events WHERE run_id = :i"), {"i": run_id}).scalar()
        return int(runs), int(entries)

    return store.db.read(read)


def assert_nothing_of(store, run_id: str, since) -> None:
    """No trace of ``run_id``: no run row, no journal entry, no change after ``since``."""
    assert _counts(store, run_id) == (0, 0)
    changes = store.feed.changes_since(since, limit=1000).changes
    assert [c.run_id for c in changes if c.run_id == run_id] == []


def assert_once(store, run_id: str) -> None:
    """Exactly one run row and one journal entry for ``run_id``."""
    assert _counts(store, run_id) == (1, 1)


def assert_value_free(exc: BaseException) -> None:
    """No driver exception (which may quote SQL or values) anywhere in ``exc``'s chain."""
    from sqlalchemy.exc import SQLAlchemyError

    seen = exc
    while seen is not None:
        assert not isinstance(seen, SQLAlchemyError), type(seen)
        assert type(seen).__module__.split(".")[0] not in ("sqlite3", "psycopg"), type(seen)
        seen = seen.__cause__ or seen.__context__


# --------------------------------------------------------------------------- read-only media


@pytest.fixture
def readonly_mount() -> Iterator:
    """A small tmpfs the test can remount read-only (``.root``, ``.set_readonly(bool)``); skips without root."""
    if not _can_mount():
        pytest.skip("mounting a filesystem needs root and a permitted mount")
    root = Path(f"/tmp/fencepost-ro-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(root)], check=True, capture_output=True)

    class Mount:
        def __init__(self) -> None:
            self.root = root

        def set_readonly(self, readonly: bool) -> None:
            mode = "remount,ro" if readonly else "remount,rw"
            subprocess.run(["mount", "-o", mode, str(root)], check=True, capture_output=True)

    try:
        yield Mount()
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def unprivileged(fn, *args):
    """Run ``fn(*args)`` in a forked child without root's override of file permissions (uid
    ``nobody`` when we are root), and return its result or re-raise its exception here."""
    import pickle

    read, write = os.pipe()
    data = bytearray()

    def child() -> None:  # drop root, run, report (``run_forked`` leaves without the parent's cleanups)
        os.close(read)
        _drop_root()
        try:
            payload = pickle.dumps(("ok", fn(*args)))
        except BaseException as exc:
            payload = pickle.dumps(("err", exc))
        with os.fdopen(write, "wb") as out:
            out.write(payload)

    def collect() -> None:  # in the parent: read it all before waiting (a large result fills the pipe)
        os.close(write)
        with os.fdopen(read, "rb") as inp:
            data.extend(inp.read())

    run_forked(child, parent=collect)
    kind, value = pickle.loads(bytes(data))
    if kind == "err":
        raise value
    return value


def _drop_root() -> None:
    """In a forked child: become ``nobody`` when running as root (no override of file permissions)."""
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)


def record(fault: str, backend: str, seen: str, recovered_s: float) -> None:
    """Print one line for the fault report (``pytest tests/faults -s | grep FAULT-REPORT``):
    the fault, what the caller saw, and the seconds from the fault clearing to a successful write."""
    print(f"\nFAULT-REPORT | {fault} | {backend} | {seen} | {recovered_s:.3f}s")


@contextlib.contextmanager
def reader_as_nobody(url: str):
    """A read-only store on ``url`` in a forked child without root's override (uid ``nobody``): it
    reads the run ids, and the block runs once it has. Yields ``go()``: the child then reads the run
    ids again and run ``r2``'s status, and ``go`` returns ``[ids, ids, status]`` (an exception's repr
    in place of what failed)."""
    import pickle

    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()

    def reader() -> None:
        os.close(to_child_w)
        os.close(to_parent_r)
        seen: list = []
        try:
            _drop_root()
            with fencepost.open(url, readonly=True) as store:
                seen.append(sorted(r.run_id for r in store.feed.iter_runs()))
                os.write(to_parent_w, b"r")
                os.read(to_child_r, 1)  # go(): the block has written
                seen.append(sorted(r.run_id for r in store.feed.iter_runs()))
                seen.append(store.runs.get("r2").status)
        except BaseException as exc:  # reported to the test
            seen.append(repr(exc))
        os.write(to_parent_w, pickle.dumps(seen))

    def parent_ends() -> None:
        os.close(to_child_r)
        os.close(to_parent_w)

    # The fork and the wait on a thread of their own: the block runs while the reader lives.
    exit_code: list[int] = []
    waiter, failed = run_in_background(lambda: exit_code.append(run_forked(reader, parent=parent_ends)))

    def go() -> list:
        os.write(to_child_w, b"g")
        data = b""
        while chunk := os.read(to_parent_r, 65536):
            data += chunk
        return pickle.loads(data)

    try:
        assert os.read(to_parent_r, 1) == b"r", "the reader failed before its first read"
        yield go
    finally:
        os.close(to_child_w)
        waiter.join()
        os.close(to_parent_r)
    assert failed == [] and exit_code == [0], (failed, exit_code)


def shard_records(urls: list[str]) -> list:
    """Each store's shard-set membership record, read through a read-only open."""
    import fencepost
    from fencepost.shards import membership

    out = []
    for url in urls:
        with fencepost.open(url, readonly=True) as store:
            out.append(membership.read(store))
    return out


def fill_file(path) -> None:
    """Grow ``path`` until its disk refuses even one more byte (ENOSPC, nothing else)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        size = 65536
        while size:
            try:
                os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                size //= 2
    finally:
        os.close(fd)
