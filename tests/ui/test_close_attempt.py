"""Closing the console leaves no thread and no connection of a store it was waiting for, on both backends.

The store's database did not answer at start-up; it answers, slowly, while the console shuts down:
an open attempt is in flight, its store opened and its connection held. Before, closing the store
returned at once and that attempt's thread went on (closing what it opened a moment later, after
the app had shut down). Now closing the store waits for the attempt, bounded by the connect timeout,
so once the app's shutdown returns no console thread is alive and no connection of it is open.

Unless the attempt has no connection yet, its first one still waiting for a server that never
answers: then there is no session to leave behind and nothing can cut the driver's wait short, so
the close returns at once and the attempt ends on its own within its connect timeout, leaving
nothing open.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

import fencepost
from fencepost.errors import OpenError
from fencepost.ui import awaited, create_app
from fencepost.ui.server import UiServer
from tests.conftest import SilentServer, require_postgres

#: Seconds the attempt holds its opened store before handing it over (well under the connect timeout).
SLOW_S = 1.5


def _console_threads(before: set[threading.Thread]) -> list[str]:
    """fencepost's threads alive now that were not before (another test's console may still serve)."""
    return [t.name for t in threading.enumerate()
            if t not in before and t.name.startswith("fencepost") and t.is_alive()]


def _connections(url: str, app_name: str) -> int:
    """Connections open to the store: PostgreSQL sessions named ``app_name``, else the SQLite file's
    descriptors held by this process."""
    if url.startswith("sqlite:"):
        path = os.path.realpath(url[len("sqlite:///"):])
        held = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            held += target == path
        return held
    engine = create_engine(require_postgres(), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"),
                                {"n": app_name}).scalar_one()
    finally:
        engine.dispose()


def _settled_connections(url: str, app_name: str) -> int:
    """``_connections`` once it reads 0, or after 5 s. A PostgreSQL server ends a session's backend
    after its client has closed the socket, so a loaded server may still list a session the
    console already closed; a connection the console left open stays listed through the wait."""
    deadline = time.monotonic() + 5
    held = _connections(url, app_name)
    while held and time.monotonic() < deadline:
        time.sleep(0.1)
        held = _connections(url, app_name)
    return held


def test_closing_the_console_joins_an_open_attempt_in_flight(
        db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    app_name = "fp-close-" + uuid.uuid4().hex[:8]
    url = db_url
    if not db_url.startswith("sqlite:"):
        url = make_url(db_url).update_query_dict({"application_name": app_name}).render_as_string(
            hide_password=False)
    fencepost.open(url).close()
    assert _connections(url, app_name) == 0
    real_open = fencepost.open
    calls: list[str] = []
    opened = threading.Event()

    def slow_open(u: Any, **kwargs: Any) -> Any:
        calls.append(u)
        if len(calls) == 1:  # the console's start-up: the database does not answer yet
            error = OpenError("cannot_connect", "open", "the database did not answer")
            error.transient = True
            raise error
        store = real_open(u, **kwargs)
        store.feed.position()  # a connection opened and pooled
        opened.set()
        time.sleep(SLOW_S)
        return store

    monkeypatch.setattr(fencepost, "open", slow_open)
    monkeypatch.setattr(awaited, "RETRY_S", 0.0)
    before = set(threading.enumerate())
    app = create_app(url, tick=0.2, poll_interval=0.3)
    assert isinstance(app.state.store, awaited.AwaitedStore)
    with UiServer(app) as server:
        httpx.get(server.url + "/health.json", timeout=10)  # starts an attempt if none runs yet
        assert opened.wait(10), "no open attempt reached the database"
    left = _console_threads(before)
    held = _settled_connections(url, app_name)
    assert (left, held) == ([], 0), f"after the console closed: threads {left} alive, {held} connection(s) open"


def test_closing_the_console_closes_its_awaited_stores_at_once_not_one_after_another(
        make_db_url: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each store's close waits for its open attempt in flight, up to its connect timeout; the
    console's shutdown closed its stores one after another, so two stores whose databases were slow
    to answer kept a Ctrl-C'd console up for twice that. Now their closes run together: each
    attempt here holds its store until two closes are under way (else until its own 5 s run out),
    and the most closes seen under way at once is 2 (was 1). Both backends."""
    urls = {"a": make_db_url(), "b": make_db_url()}
    for url in urls.values():
        fencepost.open(url).close()
    real_open = fencepost.open
    real_close = awaited.AwaitedStore.close
    started: list[str] = []
    opened = threading.Semaphore(0)
    lock = threading.Lock()
    closing = {"now": 0, "most": 0}
    both_closing = threading.Event()

    def slow_open(u: Any, **kwargs: Any) -> Any:
        with lock:
            first = u not in started
            started.append(u)
        if first:  # the console's start-up: the database does not answer yet
            error = OpenError("cannot_connect", "open", "the database did not answer")
            error.transient = True
            raise error
        store = real_open(u, **kwargs)
        opened.release()
        both_closing.wait(5)
        return store

    def counted_close(self: Any) -> None:
        with lock:
            closing["now"] += 1
            closing["most"] = max(closing["most"], closing["now"])
            if closing["now"] >= 2:
                both_closing.set()
        try:
            real_close(self)
        finally:
            with lock:
                closing["now"] -= 1

    monkeypatch.setattr(fencepost, "open", slow_open)
    monkeypatch.setattr(awaited, "RETRY_S", 0.0)
    monkeypatch.setattr(awaited.AwaitedStore, "close", counted_close)
    app = create_app(urls, tick=0.2, poll_interval=0.3)
    with UiServer(app) as server:
        httpx.get(server.url + "/health.json", timeout=10)  # starts an attempt for each store
        assert opened.acquire(timeout=10) and opened.acquire(timeout=10), "the open attempts did not start"
    assert closing["most"] == 2, closing


def test_closing_a_store_whose_server_never_answers_returns_at_once_and_leaves_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's host swallows traffic: its open attempt is in flight, its connection waiting for
    an answer that never comes. Before: ``close`` waited the whole ``connect_timeout`` (3 s here,
    10 s by default), and the console's shutdown with it. Now it returns at once (the attempt holds
    no session to leave behind), and the attempt ends on its own when the driver gives up: its
    socket closed, its thread gone, every engine it built disposed with nothing checked out.
    PostgreSQL only: a SQLite open never waits for a server that does not answer."""
    from fencepost import _durable

    built: list[Any] = []
    disposed: list[Any] = []
    real_init, real_dispose = _durable.Database.__init__, _durable.Database.dispose

    def recorded_init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        built.append(self)

    def recorded_dispose(self: Any) -> None:
        disposed.append(self)
        real_dispose(self)

    monkeypatch.setattr(_durable.Database, "__init__", recorded_init)
    monkeypatch.setattr(_durable.Database, "dispose", recorded_dispose)
    silent = SilentServer()
    url = f"postgresql+psycopg://someone@127.0.0.1:{silent.port}/db?connect_timeout=3"
    store = awaited.open_or_await(url)  # nothing listens yet: refused at once, served as down
    try:
        assert isinstance(store, awaited.AwaitedStore)
        monkeypatch.setattr(awaited, "RETRY_S", 0.0)
        silent.listen()
        with pytest.raises(OpenError):
            store.feed  # starts the attempt  # noqa: B018
        assert silent.reached.wait(10), "the open attempt never reached the server"
        attempt = store._attempt
        assert attempt is not None and attempt.is_alive()
        started = time.monotonic()
        store.close()
        took = time.monotonic() - started
        assert took < 2.0, f"close took {took:.2f} s"  # it would wait the 3 s connect timeout
        attempt.join(3 + 5)  # the driver gives up after connect_timeout
        assert not attempt.is_alive(), "the open attempt outlived its connect timeout"
        assert len(silent.held) == 1 and not silent.still_held(), "the attempt's connection stayed open"
        assert built and all(db in disposed and db.engine.pool.checkedout() == 0 for db in built), (built, disposed)
        assert store.opened is None
        with pytest.raises(OpenError) as closed:
            store.feed  # noqa: B018
        assert "closed" in closed.value.detail
    finally:
        silent.close()
