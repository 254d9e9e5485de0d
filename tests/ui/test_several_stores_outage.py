"""A store's database goes away and comes back while the console serves it, alone or beside another
store, on both backends.

The fault is real: the SQLite file is moved away (``mv flows.db elsewhere``) and back, the PostgreSQL
schema renamed away and back, while the console serves both stores.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import text

import fencepost
from fencepost.ui import create_app
from fencepost.ui.server import UiServer

from .conftest import EventStream

PAGES = ("/", "/runs/r-1", "/journal", "/projections", "/health", "/health.json")


@contextmanager
def store_gone(url: str) -> Iterator[None]:
    """The database at ``url`` out of reach of every connection, then put back: a SQLite file moved
    away, a PostgreSQL schema renamed."""
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        os.rename(path, path + ".away")
        try:
            yield
        finally:
            os.rename(path + ".away", path)
        return
    with fencepost.open(url) as store:
        schema = store.db.schema
        conn = store.db.connect()
        try:
            conn.execute(text(f"ALTER SCHEMA {schema} RENAME TO {schema}_away"))
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text(f"ALTER SCHEMA {schema}_away RENAME TO {schema}"))
                conn.commit()
        finally:
            conn.close()


def _code(r: httpx.Response) -> str:
    m = re.search(r'<code id="error-code">([^<]*)</code>', r.text)
    return m.group(1) if m else f"(JSON or no code: {r.text[:200]})"


@pytest.mark.parametrize("several", [False, True], ids=["one-store", "every-store"])
def test_a_store_gone_and_back_keeps_pages_and_live_updates(
        make_db_url: Any, several: bool, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """Its database gone (a SQLite file moved away), the projections page was a 500
    ``internal_error`` with a traceback in the log, and the follower died on a traceback of its own
    (its recovery read the gone store's position): once the database was back, no page got a live
    change again. Now every page is a 503 naming a store error code, nothing logs a traceback, and
    writes to every store reach the event stream again once the database is back. Over several
    stores the same holds with every store gone."""
    from fencepost.projections import ProjectionBuilder, RunsByStatus

    urls = {"one": make_db_url(), "two": make_db_url()} if several else {"one": make_db_url()}
    for name, url in urls.items():
        with fencepost.open(url) as store:
            store.runs.create("r-1" if name == "one" else "r-2", '{"flowName": "f"}')
            with ProjectionBuilder(store, store.url, RunsByStatus()) as builder:
                builder.catch_up()
    served = urls if several else urls["one"]
    with UiServer(create_app(served, tick=0.2, poll_interval=0.3)) as console:
        stream = EventStream(console.url)
        try:
            stream.wait(lambda n, d: n == "stats", 10)
            capfd.readouterr()
            with contextlib.ExitStack() as gone:
                for url in urls.values():  # every store: one of several down is in test_several_stores_partial_outage
                    gone.enter_context(store_gone(url))
                stream.wait(lambda n, d: n == "unavailable", 10)
                codes = {path: (r.status_code, _code(r)) for path in PAGES if path != "/health.json"
                         for r in [httpx.get(console.url + path, timeout=10, follow_redirects=True)]}
                gone_json = httpx.get(console.url + "/health.json", timeout=10).status_code
                time.sleep(1.5)  # the follower keeps trying meanwhile
            err = capfd.readouterr().err
            stream.wait(lambda n, d: n == "stats", 10)
            for name, url in reversed(urls.items()):
                with fencepost.open(url) as writer:
                    writer.runs.create("after-" + name, '{"flowName": "f"}')
                # The run's event, or a reset (the file reads as replaced): a page then reloads, and
                # the reloaded page lists the run.
                event, _, _ = stream.wait(lambda n, d, name=name: n == "reset" or (
                    n == "run" and d["run_id"] == "after-" + name and d.get("store", "one") == name), 10)
                if event == "reset":
                    assert "after-" + name in httpx.get(console.url + "/", timeout=10).text
        finally:
            stream.close()
        back = {path: httpx.get(console.url + path, timeout=10, follow_redirects=True).status_code
                for path in PAGES}
    assert all(status == 503 and code != "internal_error" for status, code in codes.values()), codes
    assert gone_json == 503
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
    assert not [r.getMessage() for r in caplog.records if r.exc_info]  # no traceback logged either
    assert back == dict.fromkeys(PAGES, 200), back
