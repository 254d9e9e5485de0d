"""Something other than PostgreSQL answering at a PostgreSQL URL's host and port (a mistyped port
that reaches an SSH daemon, an HTTP proxy, a MySQL server) is said to be that, never a refused login.

Defect: the open's diagnosis read such a peer as a server that let no credentials in, and reported
``auth_failed`` ("authentication or role refused"), which sends the operator after a password that
is fine. Now it is ``open_failed``, not transient (waiting cures no wrong port), saying that what
answers there is not a PostgreSQL server. The peers are real listening sockets that send what those
services send first; no database server is involved. PostgreSQL only: SQLite opens a file, with no
peer that could be the wrong service.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

import fencepost
from fencepost import OpenError
from fencepost._dialects import _pg_startup_refusal
from tests.cli.conftest import assert_one_line_error
from tests.conftest import SilentServer
from tests.faults.conftest import assert_value_free

SECRET = "pw-Foreign-47"
GREETINGS = {
    "ssh": b"SSH-2.0-OpenSSH_9.6\r\n",
    "http": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    # A MySQL handshake packet: a 3-byte little-endian length, sequence 0, protocol 10, version.
    "mysql": b"\x4a\x00\x00\x00\x0a8.0.36\x00" + b"\x01" * 64,
}


class ForeignListener(SilentServer):
    """A TCP port whose every connection gets ``greeting`` at once; what the client sends next is
    read, and the connection closed, as those services do with a request they cannot parse."""

    def __init__(self, greeting: bytes) -> None:
        super().__init__()
        self.greeting = greeting
        self.listen()

    def _took(self, conn: socket.socket) -> None:
        threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.sendall(self.greeting)
            conn.settimeout(1)
            conn.recv(4096)
        except OSError:
            pass
        conn.close()

    def url(self) -> str:
        return f"postgresql://app:{SECRET}@127.0.0.1:{self.port}/app?connect_timeout=2"


@pytest.fixture(params=sorted(GREETINGS))
def foreign(request: pytest.FixtureRequest) -> Iterator[ForeignListener]:
    listener = ForeignListener(GREETINGS[request.param])
    try:
        yield listener
    finally:
        listener.close()


@pytest.mark.parametrize("service", sorted(GREETINGS))
def test_the_probe_tells_a_peer_that_does_not_speak_postgresql(service: str) -> None:
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(GREETINGS[service])
        assert _pg_startup_refusal(ours, "u", "d", timeout=1) == "not postgresql"
    finally:
        ours.close()
        theirs.close()


def test_open_says_the_peer_is_not_postgresql_not_a_refused_login(foreign: ForeignListener) -> None:
    with pytest.raises(OpenError) as err:
        fencepost.open(foreign.url()).close()
    exc = err.value
    assert (exc.code, exc.transient) == ("open_failed", False), exc
    assert "not a PostgreSQL server" in str(exc) and "authentication" not in str(exc), exc
    assert SECRET not in str(exc) and "***" in str(exc), exc
    assert_value_free(exc)


def test_the_cli_says_so_in_one_line_and_exits_1(foreign: ForeignListener, run_cli) -> None:
    result = run_cli("--db", foreign.url(), "runs", "list")
    assert_one_line_error(result)
    assert result.code == 1, result
    assert "not a PostgreSQL server" in result.err and "check the port" in result.err, result
    assert "authentication" not in result.err and SECRET not in result.err, result


def test_a_worker_does_not_wait_for_a_wrong_port(foreign: ForeignListener, run_cli) -> None:
    """Waiting cures no wrong port: the worker exits at once, as for refused credentials."""
    result = run_cli("--db", foreign.url(), "worker", "--task", "json:loads", "--until-idle")
    assert_one_line_error(result)
    assert result.code == 1, result
    assert "not a PostgreSQL server" in result.err and "waiting" not in result.err, result
