"""``follow()`` survives a real PostgreSQL server restart mid-follow.

The shared test server is never restarted (other tests use it); this test starts a private
PostgreSQL instance of its own (``initdb`` + ``pg_ctl`` on a free port, run as the ``postgres``
user when we are root), follows it, restarts it with ``pg_ctl restart -m fast``, and checks that
the follower delivers every change once, in order, without losing its place.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import fencepost
from fencepost.changefeed import Change
from tests.conftest import run_in_background


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    return Path(which).parent if which else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


S = TypeVar("S", bound="PrivateServer")


class PrivateServer:
    def __init__(self, bindir: Path, root: Path) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "start")

    def restart(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        time.sleep(0.5)  # the follower sees the server gone before it comes back
        self.start()

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except subprocess.CalledProcessError:
            pass

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres?schema=fencepost"


@contextlib.contextmanager
def started_private(cls: type[S], prefix: str, purpose: str) -> Iterator[S]:
    """A private PostgreSQL instance of class ``cls`` (``PrivateServer`` or a subclass), initialised
    and started under ``/tmp/<prefix>-...``, stopped and removed afterwards. Without the server
    binaries the test skips, or fails when PostgreSQL is required (``purpose`` names the test)."""
    bindir = _pg_bin()
    if bindir is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        if os.environ.get("FENCEPOST_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL server binaries (initdb, pg_ctl) are required for {purpose}")
        pytest.skip("no PostgreSQL server binaries to start a private instance")
    root = Path(f"/tmp/{prefix}-{os.getpid()}-{time.monotonic_ns()}")
    server = cls(bindir, root)
    try:
        server.init()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    with started_private(PrivateServer, "fencepost-pg", "the restart test") as server:
        yield server


def _wait_for(seen: list[Change], run_id: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.run_id == run_id for c in list(seen)):
            return True
        time.sleep(0.02)
    return False


def test_follow_resumes_after_the_postgresql_server_restarts(private_server: PrivateServer) -> None:
    """A follower keeps its place across a server restart and delivers later commits once, in order."""
    store = fencepost.open(private_server.url)
    follower_store = fencepost.open(private_server.url)
    seen: list[Change] = []
    stop = threading.Event()

    def follow() -> None:
        for change in follower_store.feed.follow(stop=stop, poll_interval=0.5):
            seen.append(change)

    thread, errors = run_in_background(follow)
    try:
        store.runs.create("before", "{}")
        assert _wait_for(seen, "before", 10), "follower never saw the first commit"

        private_server.restart()

        # The writer's pooled connections died with the server; the durable writer reconnects.
        store.runs.create("after-1", "{}")
        store.runs.create("after-2", "{}")
        assert _wait_for(seen, "after-2", 30), f"follower did not resume after the restart: {seen}"
    finally:
        stop.set()
        thread.join(timeout=15)
        store.close()
        follower_store.close()
    assert not errors, errors
    assert not thread.is_alive()
    assert [c.run_id for c in seen] == ["before", "after-1", "after-2"]
    revisions = [c.revision for c in seen]
    assert revisions == sorted(revisions) and len(set(revisions)) == 3
