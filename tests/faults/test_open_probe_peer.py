"""The startup probe ``fencepost.open`` runs to learn why a PostgreSQL connection failed never
hangs on a peer that answers slowly or not as PostgreSQL does.

The peer is a real socket served by a thread; no server is involved, and SQLite has no such probe.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from fencepost._dialects import _PG_SILENT, _PROBE_TIMEOUT_S, _pg_startup_refusal


@pytest.fixture
def trickling_peer() -> Iterator[socket.socket]:
    """A socket whose peer answers the startup message with a notice of 64 KiB, one byte every
    0.1 s (hours to complete), as a broken proxy or a hostile listener could."""
    ours, theirs = socket.socketpair()
    ours.settimeout(_PROBE_TIMEOUT_S)  # what the probe's own connect sets
    stop = threading.Event()

    def serve() -> None:
        message = b"N" + struct.pack("!i", 65536) + b"x" * 65532
        try:
            for byte in message:
                if stop.wait(0.1):
                    return
                theirs.sendall(bytes([byte]))
        except OSError:
            return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield ours
    finally:
        stop.set()
        thread.join(5)
        ours.close()
        theirs.close()


def test_a_peer_that_trickles_its_answer_ends_the_probe_within_its_timeout(trickling_peer: socket.socket) -> None:
    """Each byte comes well within the per-read timeout, so only a bound on the whole exchange
    ends the probe; it then says nothing was learnt (None), as for any peer it cannot read."""
    result: list[object] = []
    probe = threading.Thread(target=lambda: result.append(_pg_startup_refusal(trickling_peer, "u", "d")),
                             daemon=True)
    began = time.monotonic()
    probe.start()
    probe.join(_PROBE_TIMEOUT_S * 4)
    assert not probe.is_alive(), "the probe was still reading after four times its timeout"
    assert result == [None]
    assert time.monotonic() - began < _PROBE_TIMEOUT_S * 4


def test_a_peer_that_never_answers_is_reported_as_silent_within_the_timeout() -> None:
    """A peer that reads the startup message and sends nothing (a stopped server): the probe says
    so (``_PG_SILENT``, which the open reports as a server that did not answer, never as a refused
    login) once its timeout has passed, and no later."""
    ours, theirs = socket.socketpair()
    try:
        began = time.monotonic()
        assert _pg_startup_refusal(ours, "u", "d", timeout=1) == _PG_SILENT
        assert 0.9 <= time.monotonic() - began < _PROBE_TIMEOUT_S
    finally:
        ours.close()
        theirs.close()

