"""``/health.json``'s follower error clears once the follower reads again, on a quiet store too.

The follower's error used to be cleared only when a change arrived: after the store came back, a
store where no run changed kept reporting ``"follower": {..., "error": ...}`` indefinitely, while
every read worked. The faults are real, on both backends:

* SQLite: the database file replaced by an empty file, then by garbage, then by the original again
  (a restore from a copy), as an operator would do it;
* PostgreSQL: the change feed's source row deleted by hand and put back as it was (the follower
  fails with ``decode_failed``: the source identity is missing). Renaming the schema away or
  terminating the follower's connections does not reach the console's follower at all (the
  change feed retries those reads itself), so that is the fault that can leave the error behind.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from sqlalchemy import text

import fencepost
from fencepost.ui import create_app
from fencepost.ui.server import UiServer


def _follower(client: httpx.Client, base: str) -> tuple[int, Any]:
    r = client.get(base + "/health.json")
    body = r.json()
    if r.status_code != 200:
        return r.status_code, body.get("error")
    return 200, body["follower"]["error"]


def _until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@contextmanager
def _broken(url: str, tmp_path: Any) -> Iterator[Callable[[], None]]:
    """Break the store for real; the callable given to the body makes the next step of the fault
    (SQLite: empty file, then garbage); leaving the block restores it, with no run changed."""
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        kept = str(tmp_path / "kept.db")
        shutil.copy(path, kept)  # quiet, and its writer closed (which checkpoints): the file alone is the store
        steps = iter((b"", b"this is not a SQLite database\n" * 200))

        def step() -> None:
            scratch = str(tmp_path / "scratch")
            with open(scratch, "wb") as f:
                f.write(next(steps))
            os.replace(scratch, path)

        step()
        try:
            yield step
        finally:
            shutil.copy(kept, str(tmp_path / "scratch"))
            os.replace(str(tmp_path / "scratch"), path)
        return
    with fencepost.open(url) as store:
        schema = store.db.schema
        conn = store.db.connect()
        try:
            row = dict(conn.execute(text(f'SELECT * FROM "{schema}".flows_run_source')).mappings().one())
            conn.execute(text(f'DELETE FROM "{schema}".flows_run_source'))
            conn.commit()
            try:
                yield lambda: None
            finally:
                names = ", ".join(row)
                conn.execute(text(f'INSERT INTO "{schema}".flows_run_source ({names}) VALUES '
                                  f'({", ".join(":" + k for k in row)})'), row)
                conn.commit()
        finally:
            conn.close()


def test_the_follower_error_clears_once_the_store_answers_again_without_a_change(db_url, tmp_path):
    with fencepost.open(db_url) as store:
        store.runs.create("quiet-1", "{}")
        store.runs.create("quiet-2", "{}")
    app = create_app(db_url, tick=0.2, poll_interval=0.5)
    with UiServer(app) as server, httpx.Client(timeout=30) as client:
        assert _follower(client, server.url) == (200, None)
        with _broken(db_url, tmp_path) as next_step:
            # The follower notices and says so (the page itself is down meanwhile).
            assert _until(lambda: app.state.hub.error is not None, 20), "the follower never noticed the fault"
            next_step()
            time.sleep(1.0)
            assert app.state.hub.error is not None
        # Back, and no run changed: the follower's reads succeed again, so its error goes.
        assert _until(lambda: _follower(client, server.url)[0] == 200, 20), _follower(client, server.url)
        assert _until(lambda: _follower(client, server.url) == (200, None), 15), _follower(client, server.url)
        # Still following: a change made now reaches the console.
        with fencepost.open(db_url) as store:
            store.runs.create("after-restore", "{}")
        assert _until(lambda: client.get(server.url + "/runs/after-restore").status_code == 200, 15)
        assert _follower(client, server.url) == (200, None)


def test_over_several_stores_a_stores_follower_error_clears_once_it_answers_again(make_db_url, tmp_path):
    urls = {"a": make_db_url(), "b": make_db_url()}
    for url in urls.values():
        with fencepost.open(url) as store:
            store.runs.create("quiet", "{}")
    app = create_app(urls, tick=0.2, poll_interval=0.5)

    def follower_of_a(client: httpx.Client) -> Any:
        part = client.get(server.url + "/health.json").json()["stores"]["a"]
        return part["follower"]["error"] if "follower" in part else ("down", part.get("error"))

    with UiServer(app) as server, httpx.Client(timeout=30) as client:
        assert follower_of_a(client) is None
        with _broken(urls["a"], tmp_path) as next_step:
            assert _until(lambda: app.state.hub.errors["a"] is not None, 20), "the follower never noticed the fault"
            next_step()
            time.sleep(1.0)
        assert _until(lambda: follower_of_a(client) is None, 20), follower_of_a(client)
        assert app.state.hub.errors == {"a": None, "b": None}
