"""Serving the console with uvicorn: in the foreground (``fencepost ui``) or on a thread (tests)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from typing import Any

#: Seconds uvicorn waits for open event streams before it closes them on shutdown.
GRACEFUL_S = 1


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free port), IPv6 when the host says so."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _server(app: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # The signal ends every open event stream first (as ``UiServer.stop`` does): uvicorn
            # would otherwise wait them out, then cancel them with a traceback on stderr.
            super().handle_exit(sig, frame)
            hub = getattr(app.state, "hub", None)
            if hub is not None and not hub.closed:
                hub.close()

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=GRACEFUL_S, server_header=False)
    return Server(config)


def serve(app: Any, sock: socket.socket) -> int | None:
    """Serve ``app`` on ``sock`` until SIGINT/SIGTERM, then shut down cleanly and return the signal.

    uvicorn handles the signal (closing the event streams, then the lifespan closes the hub and
    the store) and raises it again once it has stopped, to the handlers it found: these, which
    note it, so the command can exit as every other one does (130 after Ctrl-C, 0 after SIGTERM).
    """
    stopped: list[int] = []

    def note(sig: int, _frame: Any) -> None:
        stopped.append(sig)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _server(app).run(sockets=[sock])
    except KeyboardInterrupt:
        stopped.append(signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return stopped[0] if stopped else None


class UiServer:
    """The console on a background thread: ``with UiServer(app) as s: httpx.get(s.url)``."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.sock = bind(host, port)
        self.url = url_of(self.sock)
        self._server = _server(app)
        self._server.install_signal_handlers = lambda: None  # not the main thread
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.sock]},
                                        name="fencepost-ui-server", daemon=True)

    def start(self, timeout: float = 10.0) -> UiServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the console server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        hub = getattr(self.app.state, "hub", None)
        if hub is not None:
            hub.close()  # ends every open event stream, so shutdown does not wait for them
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> UiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
