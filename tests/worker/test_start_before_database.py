"""``fencepost worker`` started before its database answers waits for it, as ``fencepost ui`` does.

Before: a worker host started before its database (a service manager, a container) exited 1 at
start-up with ``cannot_connect``, though ``Worker.run`` already waits out an outage that comes
later. Now a failure that waiting may cure (the server takes no connection, or does not answer;
on SQLite another connection's lock held past the busy timeout) is retried with backoff, printed
once per change of state with the URL's password masked, until the database answers (then the
workers start) or the worker is stopped (SIGTERM exits 0, Ctrl-C 130, no traceback). A failure
waiting cannot cure (a missing store, a bad URL ...) still exits at once (tests/cli/
test_worker_missing_db.py, tests/cli/test_missing_schema.py).

The outages are real: a private PostgreSQL server (never the shared one) stopped, a socket that
accepts connections and never answers, and a SQLite file another connection holds exclusively.
The worker runs as a real ``fencepost worker`` process.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

import fencepost
from tests.changefeed.test_follow_server_restart import PrivateServer
from tests.cli.conftest import fencepost_exe
from tests.conftest import SilentServer
from tests.faults.conftest import private_server  # noqa: F401 - fixture

TASK = "def work(ctx):\n    return {'done': True}\n"
WAITING = "waiting for the database"


class Started:
    """A ``fencepost worker`` process, its stderr read line by line on a thread."""

    def __init__(self, url: str, cwd: Path) -> None:
        (cwd / "mytasks.py").write_text(TASK)
        env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
        self.proc = subprocess.Popen([fencepost_exe(), "--db", url, "worker", "-n", "1", "--task", "mytasks:work",
                                      "--until-idle"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, cwd=cwd)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def err(self) -> str:
        return "".join(self.lines)

    def said(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while text not in self.err:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                return text in self.err
            time.sleep(0.05)
        return True

    def ended(self, timeout: float) -> tuple[int, str, str]:
        out = self.proc.stdout.read() if self.proc.wait(timeout) is not None and self.proc.stdout else ""
        self._reader.join(5)
        return self.proc.returncode, out, self.err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _with_password(url: str) -> str:
    return url.replace("://postgres@", "://postgres:sekrit-pw@")


def test_a_worker_started_before_its_postgresql_server_waits_then_works(
        private_server: PrivateServer, tmp_path: Path) -> None:  # noqa: F811
    with fencepost.open(private_server.url) as store:
        store.runs.create("r1", "{}")
    private_server.stop()
    worker = Started(_with_password(private_server.url), tmp_path)
    try:
        assert worker.said(WAITING, 60), worker.err
        time.sleep(4)  # a few attempts, one line
        assert worker.proc.poll() is None, worker.err
        private_server.start()
        code, out, err = worker.ended(120)
    finally:
        worker.kill()
    assert code == 0, (out, err)
    # One line while the server is down; an attempt that lands while it starts up meets another
    # reason ("starting up"), which is a change of state and may print one more line.
    assert 1 <= err.count(WAITING) <= 2, err
    assert "cannot_connect" in err and "postgres:***@" in err, err
    assert "sekrit-pw" not in err + out and "Traceback" not in err, err
    with fencepost.open(private_server.url, readonly=True) as store:
        assert store.runs.get("r1").status == "completed"


@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_worker_waiting_for_a_stopped_server_stops_on_a_signal(
        private_server: PrivateServer, tmp_path: Path, sig: int, expected: int) -> None:  # noqa: F811
    fencepost.open(private_server.url).close()
    private_server.stop()
    worker = Started(private_server.url, tmp_path)
    try:
        assert worker.said(WAITING, 60), worker.err
        worker.proc.send_signal(sig)
        code, out, err = worker.ended(15)
    finally:
        worker.kill()
    assert code == expected, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_a_worker_waiting_for_a_silent_server_stops_at_once_on_sigterm(tmp_path: Path) -> None:
    """A server that accepts the connection and never answers costs each attempt its
    ``connect_timeout``; a SIGTERM in the middle of one stops the worker without waiting it out."""
    silent = SilentServer()
    silent.listen()
    url = f"postgresql+psycopg://someone:sekrit-pw@127.0.0.1:{silent.port}/db?connect_timeout=10"
    worker = Started(url, tmp_path)
    try:
        assert worker.said(WAITING, 60), worker.err
        assert silent.reached.wait(30)
        time.sleep(0.5)  # an attempt is in flight (it waits 10 s for an answer)
        sent = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        code, out, err = worker.ended(15)
        took = time.monotonic() - sent
    finally:
        worker.kill()
        silent.close()
    assert code == 0, (out, err)
    # Far below the 10 s the attempt in flight would take if the stop waited it out (a loaded
    # machine delays the signal's handling by a second or more, so the bound is loose).
    assert took < 5, took
    assert err.count(WAITING) == 1 and "cannot_connect" in err, err
    assert "sekrit-pw" not in err and "Traceback" not in err, err


def test_a_worker_started_while_another_connection_holds_its_sqlite_file_waits_then_works(tmp_path: Path) -> None:
    """SQLite has no server to be down; its transient start-up failure is another connection
    holding the file exclusively past ``busy_timeout_ms`` (``open_failed``, transient)."""
    path = tmp_path / "flows.db"
    url = f"sqlite:///{path}?busy_timeout_ms=100"
    with fencepost.open(url) as store:
        store.runs.create("r1", "{}")
    holder = sqlite3.connect(path, isolation_level=None)
    worker = None
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("CREATE TABLE held_by_a_peer (x)")
        holder.execute("COMMIT")  # exclusive locking mode keeps the lock after the commit
        worker = Started(url, tmp_path)
        assert worker.said(WAITING, 60), worker.err
        assert worker.proc.poll() is None, worker.err
        holder.close()
        code, out, err = worker.ended(120)
    finally:
        holder.close()
        if worker is not None:
            worker.kill()
    assert code == 0, (out, err)
    assert err.count(WAITING) == 1 and "open_failed" in err, err
    with fencepost.open(url, readonly=True) as store:
        assert store.runs.get("r1").status == "completed"
