"""A peer that takes the connection and closes it without a word (a TCP proxy or load balancer with
no server behind it, a connection limiter, a server going down) is a connection problem that
waiting may cure, never a refused login.

Defect: the open's diagnosis read such a peer as a server that let no credentials in and reported
``auth_failed`` ("authentication or role refused"), not transient: the operator went after a good
password, and ``fencepost worker`` exited at once instead of waiting for the database to come
back. Now it is ``cannot_connect``, transient, saying the server closed the connection without
answering. The peer is a real listening socket; no database server is involved. PostgreSQL only:
SQLite opens a file, with no peer.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import fencepost
from fencepost import OpenError
from fencepost._dialects import _PG_CLOSED, _pg_startup_refusal
from tests.cli.conftest import assert_one_line_error
from tests.conftest import SilentServer
from tests.faults.conftest import assert_value_free
from tests.worker.test_start_before_database import WAITING, Started

SECRET = "pw-Closing-83"


class ClosingListener(SilentServer):
    """A TCP port that accepts every connection and closes it at once."""

    def __init__(self) -> None:
        super().__init__()
        self.listen()

    def _took(self, conn: socket.socket) -> None:
        conn.close()

    def url(self, driver: str = "postgresql") -> str:
        return f"{driver}://app:{SECRET}@127.0.0.1:{self.port}/app?connect_timeout=2"


@pytest.fixture
def closing() -> Iterator[ClosingListener]:
    listener = ClosingListener()
    try:
        yield listener
    finally:
        listener.close()


def test_the_probe_tells_a_peer_that_closed_without_a_word() -> None:
    ours, theirs = socket.socketpair()
    theirs.close()
    try:
        assert _pg_startup_refusal(ours, "u", "d", timeout=1) == _PG_CLOSED
    finally:
        ours.close()


def test_open_says_the_connection_was_closed_and_is_transient(closing: ClosingListener) -> None:
    with pytest.raises(OpenError) as err:
        fencepost.open(closing.url()).close()
    exc = err.value
    assert (exc.code, exc.transient) == ("cannot_connect", True), exc
    assert "closed the connection without answering" in str(exc), exc
    assert "authentication" not in str(exc), exc
    assert SECRET not in str(exc) and "***" in str(exc), exc
    assert_value_free(exc)


def test_the_cli_says_so_in_one_line(closing: ClosingListener, run_cli) -> None:
    result = run_cli("--db", closing.url(), "runs", "list")
    assert_one_line_error(result)
    assert result.code == 1, result
    assert "closed the connection without answering" in result.err, result
    assert "authentication" not in result.err and SECRET not in result.err, result


def test_a_worker_waits_for_such_a_peer_then_stops_on_sigterm(closing: ClosingListener, tmp_path: Path) -> None:
    """Waiting may cure it (the server behind the proxy comes back), so the worker waits, as for a
    stopped server, instead of exiting at once as it does for refused credentials."""
    worker = Started(closing.url("postgresql+psycopg"), tmp_path)
    try:
        assert worker.said(WAITING, 60), worker.err
        assert worker.proc.poll() is None, worker.err
        worker.proc.send_signal(signal.SIGTERM)
        code, out, err = worker.ended(15)
    finally:
        worker.kill()
    assert code == 0, (out, err)
    assert "cannot_connect" in err and "closed the connection without answering" in err, err
    assert SECRET not in err + out and "Traceback" not in err, err
