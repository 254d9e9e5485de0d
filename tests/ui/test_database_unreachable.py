"""Every console route while the store's database cannot be reached: a 503 that says so, then the
pages again once the database is back, with no restart of the console.

The faults are real, on both backends: the SQLite file moved away (``mv``), or its whole directory
(a volume unmounted under the console); a private PostgreSQL server (``started_private``, never the
shared one) stopped and started again. Root reads any file whatever its mode, so an unreadable file
is not among them here.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

import fencepost
from fencepost.ui import create_app
from fencepost.ui.server import UiServer
from tests.changefeed.test_follow_server_restart import PrivateServer, started_private

PASSWORD = "pw-of-the-unreachable-store-never-shown"
PAGES = ("/", "/runs/r-1", "/runs/missing", "/runs/?id=r-1", "/journal", "/projections", "/health")
FAULTS = ["sqlite-file-moved", "sqlite-directory-moved", "postgresql-server-stopped"]


class Outage:
    """A store's URL and the fault that takes its database out of reach, then puts it back."""

    def __init__(self, url: str, gone: Any) -> None:
        self.url = url
        self.gone = gone

    def __call__(self) -> AbstractContextManager[None]:
        return self.gone()  # type: ignore[no-any-return]


@pytest.fixture(params=FAULTS)
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Outage]:
    fault = request.param
    if fault.startswith("sqlite"):
        folder = tmp_path / "data"
        folder.mkdir()
        path = folder / "flows.db"
        moved = folder if fault == "sqlite-directory-moved" else path

        @contextmanager
        def moved_away() -> Iterator[None]:
            os.rename(moved, f"{moved}.away")
            try:
                yield
            finally:
                os.rename(f"{moved}.away", moved)

        yield Outage(f"sqlite:///{path}", moved_away)
        return
    with started_private(PrivateServer, "fencepost-pg-ui503", "the console outage tests") as server:
        @contextmanager
        def stopped() -> Iterator[None]:
            server.stop()
            try:
                yield
            finally:
                server.start()

        # The private server trusts every login: the password is there to be kept off the pages.
        yield Outage(make_url(server.url).set(password=PASSWORD).render_as_string(hide_password=False), stopped)


def _seed(url: str) -> None:
    with fencepost.open(url) as store:
        store.runs.create("r-1", '{"flowName": "f"}')


def _answered(url: str) -> httpx.Response:
    """``url`` asked until it answers other than 503 (the console notices a store is back at its next
    sample, a fraction of a second here), for at most ten seconds."""
    deadline = time.monotonic() + 10
    while True:
        r = httpx.get(url, timeout=30)
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def _error_code(r: httpx.Response) -> str | None:
    m = re.search(r'<code id="error-code">([^<]*)</code>', r.text)
    return m.group(1) if m else None


def _secrets(outage: Outage) -> list[str]:
    """What no page may show of the store's URL: its password, its host and port, its file path."""
    url = make_url(outage.url)
    if url.get_backend_name() == "sqlite":
        return [str(url.database)]
    return [PASSWORD, f"{url.host}:{url.port}"]


def _assert_unreachable_page(r: httpx.Response, path: str, outage: Outage) -> None:
    assert r.status_code == 503, (path, r.status_code, r.text[-800:])
    assert r.headers["content-type"].startswith("text/html"), path
    assert r.headers["retry-after"] == "5", path
    assert "database unavailable" in r.text and "cannot be reached" in r.text, path
    assert _error_code(r) in ("persistence_failed", "read_failed", "list_failed"), (path, _error_code(r))
    assert '<meta http-equiv="refresh" content="5">' in r.text, path  # the open page recovers by itself
    for secret in _secrets(outage):
        assert secret not in r.text, (path, secret)
    assert "Traceback" not in r.text and "internal_error" not in r.text, path


def test_every_page_is_a_503_while_the_database_is_out_of_reach(
        outage: Outage, capfd: pytest.CaptureFixture[str]) -> None:
    """Before: every page (a run's page, the listing, the journal, projections and health pages)
    was ``500 error`` with "the store could not answer this page", and ``/health.json`` a 500,
    though nothing was wrong with the console or the request: the database was out of reach. Now
    each is a ``503`` saying the database cannot be reached, with ``Retry-After`` and a page that
    reloads itself, naming the store's error code and no part of its URL; once the database is
    back, every page answers again without a restart."""
    _seed(outage.url)
    with UiServer(create_app(outage.url, tick=0.2, poll_interval=0.3)) as console:
        before = {p: httpx.get(console.url + p, timeout=30).status_code for p in PAGES}
        with outage():
            down = {p: httpx.get(console.url + p, timeout=30) for p in PAGES}
            down_json = httpx.get(console.url + "/health.json", timeout=30)
        back = {p: httpx.get(console.url + p, timeout=30).status_code for p in PAGES}
        back_json = httpx.get(console.url + "/health.json", timeout=30)
    err = capfd.readouterr().err
    assert before == {**dict.fromkeys(PAGES, 200), "/runs/missing": 404}, before
    for path, r in down.items():
        _assert_unreachable_page(r, path, outage)
    assert down_json.status_code == 503 and down_json.headers["content-type"].startswith("application/json")
    assert down_json.headers["retry-after"] == "5"
    assert down_json.json()["error"] in ("persistence_failed", "read_failed")
    assert PASSWORD not in down_json.text
    assert back == before, back
    assert back_json.status_code == 200 and back_json.json()["revision"] >= 1
    assert "Traceback" not in err and PASSWORD not in err, err[-3000:]


def test_a_named_stores_pages_are_a_503_while_the_others_answer(
        outage: Outage, tmp_path: Path) -> None:
    """Over several stores, ``/runs/NAME/x`` (a run of the store that is out of reach, held or not)
    was a 500: now a 503 saying its database cannot be reached, while the other store's pages
    answer."""
    other = f"sqlite:///{tmp_path / 'other.db'}"
    _seed(outage.url)
    with fencepost.open(other) as store:
        store.runs.create("o-1", '{"flowName": "f"}')
    with UiServer(create_app({"far": outage.url, "near": other}, tick=0.2, poll_interval=0.3)) as console:
        with outage():
            far = {p: httpx.get(console.url + p, timeout=30) for p in ("/runs/far/r-1", "/runs/far/x", "/runs/r-1")}
            near = httpx.get(console.url + "/runs/near/o-1", timeout=30)
            listing = httpx.get(console.url + "/", timeout=30)
        back = _answered(console.url + "/runs/far/r-1")
    for path, r in far.items():
        _assert_unreachable_page(r, path, outage)
    assert near.status_code == 200 and listing.status_code == 200
    assert back.status_code == 200


def test_a_store_refused_when_it_opened_late_is_no_outage() -> None:
    """A store that opened late and failed a start-up check (``StoreRefused``, code ``refused``) is
    refused for good, not out of reach: it must not be answered as a 503 that tells the browser to
    retry. An open still waiting for its database, and a failed read, are. (Backend-free: the
    classification of the error alone; the pages' statuses are tested above on both backends.)"""
    from fencepost.errors import OpenError, PersistenceError
    from fencepost.ui.app import database_down
    from fencepost.ui.awaited import StoreRefused

    assert not database_down(StoreRefused("refused", "open", "the feed position moved back"))
    waiting = OpenError("cannot_connect", "open", "the database did not answer")
    assert database_down(waiting)
    assert database_down(PersistenceError("read_failed", "console", "store b does not answer"))
    assert not database_down(PersistenceError("decode_failed", "console", "a stored value"))
