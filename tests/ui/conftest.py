"""Fixtures for the console: a store the demo filled (per backend, once per test session), the console served on it.

The demo runs through the real console script with small counts (about two seconds); the console is
served by uvicorn on a thread, on a free loopback port, read-only. Tests that write use their own
writable store on the same database.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencepost
from fencepost.journal.owner import OwnerId
from fencepost.runstore.rows import RunSnapshot
from tests.cli.conftest import fencepost_exe
from tests.conftest import drop_schema, require_postgres

_CONTROL_REF = re.compile(r"&#(?:([0-9]+)|[xX]([0-9a-fA-F]+));")


def unescape(text: str) -> str:
    """``html.unescape`` as the HTML standard decodes character references: a reference to a C0
    control or DEL gives that character (Python's drops it; a browser keeps it, a parse error)."""
    def ref(m: re.Match[str]) -> str:
        code = int(m.group(1)) if m.group(1) else int(m.group(2), 16)
        return chr(code) if 0 < code < 0x20 or code == 0x7F else m.group(0)

    return html.unescape(_CONTROL_REF.sub(ref, text))


PENDING = RunSnapshot("pending", None, None)
TESTER = OwnerId("ui-test-host", 4242, "nonce-ui-test-0001")


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def demo_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database the demo filled: a dozen settled runs, a killed worker's runs stolen, a projection built."""
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'demo.db'}"
    else:
        base = require_postgres()
        schema = "t_" + uuid.uuid4().hex[:16]
        url = f"{base}?schema={schema}"
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    env["COLUMNS"] = "200"
    proc = subprocess.run([fencepost_exe(), "--db", url, "demo", "--runs", "30", "--workers", "3", "--speed", "20"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path_factory.getbasetemp())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    yield url
    if schema is not None:
        drop_schema(require_postgres(), schema)


@pytest.fixture(scope="session")
def console(demo_url: str) -> Iterator[Any]:
    """The console served on ``demo_url`` (read-only), with a fast stats tick."""
    from fencepost.ui import create_app
    from fencepost.ui.server import UiServer

    app = create_app(demo_url, tick=0.2, poll_interval=1.0)
    with UiServer(app) as server:
        yield server


@pytest.fixture(scope="session")
def writer(demo_url: str) -> Iterator[fencepost.Store]:
    """A writable store on the demo's database: the test's own writes."""
    with fencepost.open(demo_url) as store:
        yield store


def demo_run_ids(store: fencepost.Store) -> list[str]:
    out, cursor = [], None
    while True:
        page = store.feed.list_runs(None, cursor, 200)
        out += [r.run_id for r in page.runs if r.run_id.startswith("demo-")]
        cursor = page.cursor
        if cursor is None:
            return out


def fact_owners(store: fencepost.Store, run_id: str) -> set[str]:
    """The owners named by the run's ownership facts, as the console labels them (host/pid/nonce[:8])."""
    from fencepost.journal import companion_stream

    owners = set()
    for e in store.journal.entries(companion_stream(run_id), limit=10_000).entries:
        if e.event_type.startswith("flows.consensus.") and e.source_id == "flows.run-store":
            o = e.payload["owner"]
            owners.add(f"{o['hostId']}/{o['pid']}/{o['nonce'][:8]}")
    return owners


def taken_over(store: fencepost.Store) -> str:
    """A demo run another owner took over: its facts name two owners or more, and replay saw a steal."""
    from fencepost.journal import ownership_history

    for run_id in demo_run_ids(store):
        if len(fact_owners(store, run_id)) >= 2 and any(
                i.ended_by == "stolen" for i in ownership_history(store, run_id).intervals):
            return run_id
    raise AssertionError("the demo left no run taken over by another owner")


def new_run(store: fencepost.Store, prefix: str = "ui") -> str:
    run_id = f"{prefix}-{uuid.uuid4().hex[:10]}"
    store.runs.create(run_id, '{"flowName": "ui-test", "apiKey": "sk-live-SECRET-should-never-show"}')
    return run_id


def screenshot_dir(tmp_path: Path) -> Path:
    d = tmp_path / "screenshots"
    d.mkdir(exist_ok=True)
    return d


class EventStream:
    """The console's event stream read on a thread: ``wait(predicate, timeout)`` returns the first match."""

    def __init__(self, base_url: str, since: Any = None, down: str | None = None) -> None:
        import queue
        import threading

        import httpx

        self.events: queue.Queue[tuple[str, Any, float]] = queue.Queue()
        self._client = httpx.Client(timeout=httpx.Timeout(10.0, read=30.0))
        self._ready = threading.Event()
        self._socket: Any = None
        self._since = since
        self._down = down
        self._thread = threading.Thread(target=self._read, args=(base_url,), daemon=True)
        self._thread.start()
        if not self._ready.wait(5):
            raise AssertionError("the event stream did not open within 5 s")

    def _read(self, base_url: str) -> None:
        import json
        import time

        try:
            since = self._since
            if since is not None and not isinstance(since, str):
                since = f"{since.source}:{since.revision}"
            params = {} if since is None else {"since": since}
            if self._down is not None:
                params["down"] = self._down
            with self._client.stream("GET", base_url + "/events", params=params) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                self._socket = response.extensions["network_stream"].get_extra_info("socket")
                event, data = None, []
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        data.append(line[6:])
                    elif line == "" and event is not None:
                        self.events.put((event, json.loads("".join(data)), time.monotonic()))
                        if event == "hello":
                            self._ready.set()
                        event, data = None, []
        except Exception:
            pass  # closed by the test, or the server stopped

    def wait(self, predicate: Any, timeout: float) -> tuple[str, Any, float]:
        """The first event (``(name, data, arrival)``) with ``predicate(name, data)``, within ``timeout`` s."""
        import queue
        import time

        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching event within {timeout} s")
            try:
                name, data, at = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if predicate(name, data):
                return name, data, at

    def close(self) -> None:
        """Hang up now, as a closed tab does.

        Closing the client alone only closes the socket's descriptor: the reader thread is still
        blocked in ``recv`` on it, so the kernel sends nothing to the server until the next frame
        arrives (up to a stats interval later). Shutting the socket down sends the FIN at once and
        wakes the reader.
        """
        import socket

        if self._socket is not None:
            try:
                self._socket.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the server already closed it
        self._client.close()
        self._thread.join(5)


@pytest.fixture
def events(console: Any) -> Iterator[EventStream]:
    stream = EventStream(console.url)
    yield stream
    stream.close()
