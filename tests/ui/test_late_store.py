"""A store that did not answer when the console started: checked once it opens, and never a wait.

The start-up checks that read a store (the same database given twice, a recorded shard set given
whole) cannot read a store whose server is down then; they run when it first opens, and a store
that fails them then is served as refused, with the error the start-up would have given, while
the other stores keep serving. And an open attempt of such a store never holds up a request: one
attempt runs at a time, and a request that finds one in flight answers "down" at once.

The outages are real: a private PostgreSQL server stopped before the console starts and started
again, and a socket that accepts connections and never answers (a host that swallows traffic).
A SQLite store cannot be down at start-up in a way a test can hold (no server), so SQLite takes
part as the stores that answer and as shards of the set.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

import fencepost
from fencepost.errors import OpenError
from fencepost.ui import awaited
from tests.changefeed.test_follow_server_restart import PrivateServer, private_server  # noqa: F401
from tests.conftest import SilentServer

from .test_cli import _get_when_up, _serve, _stop
from .test_several_stores_partial_outage import DOWN_MARK


def _one_store_spelt_twice(server: PrivateServer) -> tuple[str, str]:
    """Two URLs of one store on the private server (created there), the server stopped."""
    first = server.url
    second = make_url(first).update_query_dict({"application_name": "other-spelling"}).render_as_string(
        hide_password=False)
    fencepost.open(first).close()
    server.stop()
    return first, second


def _health_when(console: str, done: Any, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(console + "/health.json", timeout=10).json()
        if done(health) or time.monotonic() > deadline:
            return health
        time.sleep(0.2)


def _settled(health: dict[str, Any], name: str) -> bool:
    part = health["stores"][name]
    return part.get("error") not in ("cannot_connect", None) or "source" in part


def test_a_store_down_at_start_that_is_the_same_database_as_another_is_refused_once_it_opens(
        private_server: PrivateServer) -> None:  # noqa: F811
    """Before: ``--db a=URL --db b=URL'`` (one database spelt twice) with its server down at
    start-up served both once the server ran: the same-database check was skipped and never run.
    Now the store that opens second is refused with the start-up's own message, and the other
    store serves."""
    first, second = _one_store_spelt_twice(private_server)
    proc, console = _serve("--db", f"a={first}", "--db", f"b={second}", "ui", "--port", "0")
    try:
        _get_when_up(console + "/")
        private_server.start()
        health = _health_when(console, lambda h: all(_settled(h, n) for n in "ab"))
        refused = [n for n in "ab" if health["stores"][n].get("error") == "refused"]
        page = httpx.get(console + "/", timeout=10)
    finally:
        code, err = _stop(proc)
    assert len(refused) == 1, health
    part = health["stores"][refused[0]]
    assert part["detail"] == ("--db #2 is the same database as --db #1 (one source id): give each store once"), part
    serving = "b" if refused == ["a"] else "a"
    assert "source" in health["stores"][serving], health
    assert page.status_code == 200
    assert code == 130 and "Traceback" not in err, err
    assert "refused" in err and "same database" in err, err


def test_create_app_refuses_a_late_store_that_is_the_same_database(
        private_server: PrivateServer, tmp_path: Path) -> None:  # noqa: F811
    """``create_app({name: url})`` runs its same-database check when a late store opens: the second
    of one database is refused with the ``ValueError``'s message; a SQLite store beside them serves."""
    from fencepost.ui import create_app
    from fencepost.ui.server import UiServer

    first, second = _one_store_spelt_twice(private_server)
    lite = f"sqlite:///{tmp_path / 'c.db'}"
    fencepost.open(lite).close()
    app = create_app({"a": first, "b": second, "c": lite}, tick=0.2, poll_interval=0.3)
    with UiServer(app) as server:
        private_server.start()
        health = _health_when(server.url, lambda h: all(_settled(h, n) for n in "ab"))
    refused = [n for n in "ab" if health["stores"][n].get("error") == "refused"]
    assert len(refused) == 1, health
    assert "is the same database as store" in health["stores"][refused[0]]["detail"], health
    assert "source" in health["stores"]["c"], health


def _shard_pair(tmp_path: Path, private_server: PrivateServer) -> tuple[str, str, str]:  # noqa: F811
    """A shard set of a SQLite shard and a PostgreSQL shard, and a PostgreSQL store of no set; the
    server stopped. Their URLs: ``(sqlite shard, pg shard, pg store of no set)``."""
    s0 = f"sqlite:///{tmp_path / 's0.db'}"
    s1 = make_url(private_server.url).update_query_dict({"schema": "s1"}).render_as_string(
        hide_password=False)
    loose = make_url(private_server.url).update_query_dict({"schema": "loose"}).render_as_string(
        hide_password=False)
    fencepost.open_shards({"s0": s0, "s1": s1}).close()
    fencepost.open(loose).close()
    private_server.stop()
    return s0, s1, loose


def test_a_late_store_that_leaves_a_shard_set_partial_is_refused_and_a_late_shard_is_not(
        tmp_path: Path, private_server: PrivateServer) -> None:  # noqa: F811
    """Before: a shard given beside a store whose server was down at start-up passed the "give
    every shard of the set" check (the late store might be the missing shard) and that was never
    checked again. Now the late store is checked when it opens: a store of no set is refused with
    the start-up's message; the set's missing shard, given the same way, serves."""
    s0, s1, loose = _shard_pair(tmp_path, private_server)
    proc, console = _serve("--db", s0, "--db", f"x={loose}", "ui", "--port", "0")
    try:
        _get_when_up(console + "/")
        private_server.start()
        health = _health_when(console, lambda h: _settled(h, "x"))
        page = httpx.get(console + "/", timeout=10)
    finally:
        code, err = _stop(proc)
    assert health["stores"]["x"].get("error") == "refused", health
    assert health["stores"]["x"]["detail"] == ("--db #1 is a shard of a set of 2 and 1 of them were given: "
                                               "give every shard of the set"), health
    assert "source" in health["stores"]["s0"], health
    mark = DOWN_MARK.pattern.replace('data-store="b"', 'data-store="x"')
    found = re.search(mark, page.text, re.S)
    assert page.status_code == 200 and found and found.group(1) == "refused", page.text[-3000:]
    assert "give every shard of the set" in page.text
    assert code == 130 and "Traceback" not in err, err

    private_server.stop()
    proc, console = _serve("--db", s0, "--db", f"s1={s1}", "ui", "--port", "0")
    try:
        _get_when_up(console + "/")
        private_server.start()
        health = _health_when(console, lambda h: _settled(h, "s1"))
    finally:
        code, err = _stop(proc)
    assert "source" in health["stores"]["s1"] and "source" in health["stores"]["s0"], health
    assert code == 130 and "Traceback" not in err, err


def test_a_request_never_waits_for_an_open_attempt_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``AwaitedStore`` held its lock for a whole open attempt, so with the store's host
    swallowing traffic every request to it (from any thread: the console's request workers, its
    follower, its ticker) waited up to ``connect_timeout``. Now one attempt runs at a time and a
    request that finds it in flight answers "down" at once: here twenty threads each get their
    ``OpenError`` while the attempt (connect_timeout 60 s) is still holding its connection."""
    silent = SilentServer()
    url = f"postgresql+psycopg://someone@127.0.0.1:{silent.port}/db?connect_timeout=60"
    store = awaited.open_or_await(url)  # nothing listens yet: refused at once, served as down
    try:
        assert isinstance(store, awaited.AwaitedStore) and store.error.code == "cannot_connect"
        monkeypatch.setattr(awaited, "RETRY_S", 0.0)
        silent.listen()
        first: list[Any] = []
        starter = threading.Thread(target=lambda: first.append(_request(store)), daemon=True)
        starter.start()
        assert silent.reached.wait(30), "the open attempt never reached the server"
        answers: list[Any] = []
        threads = [threading.Thread(target=lambda: answers.append(_request(store)), daemon=True)
                   for _ in range(20)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20  # a third of connect_timeout: the attempt's first connect still waits
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        answered = list(answers)
        # Still the attempt's first connection, open at the client's end: that attempt is in flight.
        in_flight = len(silent.held) == 1 and silent.still_held() and store.opened is None
        starter.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        silent.close()
        store.close()
    assert in_flight, "the open attempt ended before the requests were looked at"
    assert len(answered) == 20 and all(isinstance(a, OpenError) for a in answered), answered
    assert first and isinstance(first[0], OpenError), first


def _request(store: Any) -> Any:
    try:
        return store.feed
    except OpenError as exc:
        return exc
