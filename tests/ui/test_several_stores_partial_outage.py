"""One store of a console over several goes down while the others keep answering.

A console watching several stores reads each store on its own: the pages of a healthy store keep
rendering, the overview pages (runs, journal, projections, health) show the healthy stores' data
and mark the store that is down with its error code, ``/health.json`` and the event stream say the
same per store, and a healthy store's writes keep reaching the open pages live. Once the store is
back, every page and the live updates resume.

The faults are real: a SQLite file moved away, a PostgreSQL schema renamed away, and a private
PostgreSQL server stopped (``pg_ctl stop -m immediate``) and started again.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

import fencepost
from fencepost.projections import ProjectionBuilder, RunsByStatus
from fencepost.ui import create_app
from fencepost.ui.server import UiServer
from tests.changefeed.test_follow_server_restart import PrivateServer, private_server  # noqa: F401

from .conftest import EventStream
from .test_browser import _until, browser  # noqa: F401  (the browser fixture)
from .test_several_stores_outage import store_gone

PASSWORD = "pw-of-the-down-store-never-shown"
OVERVIEW = ("/", "/journal", "/projections", "/health")
DOWN_MARK = re.compile(r'<section class="store-down" data-store="b"[^>]*>.*?<code class="store-error">([^<]*)</code>',
                       re.S)


def _with_password(url: str) -> str:
    """``url`` with a password in it (the test servers trust local connections and ignore it)."""
    if url.startswith("sqlite:"):
        return url
    return make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


def _seed(urls: dict[str, str]) -> None:
    for name, url in urls.items():
        with fencepost.open(url) as store:
            store.runs.create(f"{name}-1", '{"flowName": "f"}')
            with ProjectionBuilder(store, store.url, RunsByStatus()) as builder:
                builder.catch_up()


def _get(console: UiServer, path: str) -> httpx.Response:
    return httpx.get(console.url + path, timeout=10, follow_redirects=False)


def _error_code(r: httpx.Response) -> str:
    m = re.search(r'<code id="error-code">([^<]*)</code>', r.text)
    return m.group(1) if m else f"(no code: {r.text[:200]})"


def _is_code(text: str) -> bool:
    """A store error code (``persistence_failed``, ``read_failed`` ...), not the console's own failure."""
    return re.fullmatch(r"[a-z_]+", text) is not None and text != "internal_error"


def _check_partial_outage(urls: dict[str, str], down: Callable[[], AbstractContextManager[None]],
                          capfd: pytest.CaptureFixture[str]) -> None:
    """Store ``b`` of ``urls`` down (``down()``) while ``a`` answers: what every page and the stream say."""
    with UiServer(create_app(urls, tick=0.2, poll_interval=0.3)) as console:
        stream = EventStream(console.url)
        try:
            stream.wait(lambda n, d: n == "stats", 10)
            capfd.readouterr()
            with down():
                # The stream says which store is down, and goes on with the stats of the others.
                _, gone, _ = stream.wait(lambda n, d: n == "unavailable" and d.get("store") == "b", 10)
                _, stats, _ = stream.wait(lambda n, d: n == "stats" and "error" in d["stores"]["b"], 10)
                pages = {path: _get(console, path) for path in (*OVERVIEW, "/runs/a/a-1", "/runs/a-1",
                                                                 "/runs/b/b-1", "/health.json")}
                # The runs page as its script opens its stream: the positions it has, the stores it
                # was rendered without. A store left out of ?since= without ?down= is a reset.
                at = json.loads(unescape(re.search(r'data-position="([^"]+)"', pages["/"].text).group(1)))["stores"]
                rendered_without = re.search(r'data-down="([^"]*)"', pages["/"].text).group(1)
                since = ",".join(f"{n}={p['source']}:{p['revision']}" for n, p in at.items() if p["source"])
                partial = EventStream(console.url, since=since, down=rendered_without.replace(" ", ","))
                partial.wait(lambda n, d: n == "hello", 5)
                partial.wait(lambda n, d: n == "unavailable" and d.get("store") == "b", 5)
                not_said = httpx.get(console.url + "/events", params={"since": since}, timeout=5).text
                # A healthy store's write reaches the open page live meanwhile.
                with fencepost.open(urls["a"]) as writer:
                    writer.runs.create("a-during", '{"flowName": "f"}')
                stream.wait(lambda n, d: n == "run" and d["run_id"] == "a-during" and d["store"] == "a", 10)
            err = capfd.readouterr().err
            # Back: stats of both stores again, the page rendered without it reloads (once), and a
            # write to the store that was down arrives live.
            stream.wait(lambda n, d: n == "stats" and "health" in d["stores"]["b"], 10)
            _, reset, _ = partial.wait(lambda n, d: n == "reset", 10)
            with fencepost.open(urls["b"]) as writer:
                writer.runs.create("b-after", '{"flowName": "f"}')
            stream.wait(lambda n, d: n in ("run", "reset") and d.get("run_id", "b-after") == "b-after", 10)
        finally:
            stream.close()
            if "partial" in locals():
                partial.close()
        back = {path: _get(console, path) for path in (*OVERVIEW, "/runs/b/b-1", "/health.json")}

    assert _is_code(gone["error"]), gone
    assert _is_code(stats["stores"]["b"]["error"]) and stats["stores"]["a"]["health"]["revision"] >= 1
    assert stats["counts"]["pending"] >= 1  # the healthy store's counts

    for path in OVERVIEW:
        r = pages[path]
        assert r.status_code == 200, (path, r.status_code, _error_code(r))
        assert DOWN_MARK.search(r.text), (path, r.text[-3000:])
        assert _is_code(DOWN_MARK.search(r.text).group(1)), path  # the code of the read that failed there
    assert rendered_without == "b" and at["b"] == {"source": None, "revision": None} and at["a"]["source"]
    # A SQLite file moved back may also read as replaced first (its own reset, as over one store).
    assert reset["reason"] == "store_back" or (urls["b"].startswith("sqlite") and reset["reason"] == "source_changed")
    assert not_said.count("event: reset") == 1 and "event: run" not in not_said
    assert 'data-run-id="a-1" data-store="a"' in pages["/"].text
    assert 'data-store="b" data-revision' not in pages["/"].text
    assert 'data-store="a"' in pages["/journal"].text and "hash chain verified" in pages["/journal"].text
    assert 'id="projections-a"' in pages["/projections"].text
    assert 'data-field="revision"' in pages["/health"].text

    assert pages["/runs/a/a-1"].status_code == 200 and 'id="run-status">pending<' in pages["/runs/a/a-1"].text
    assert pages["/runs/a-1"].status_code == 307 and pages["/runs/a-1"].headers["location"] == "/runs/a/a-1"
    b_page = pages["/runs/b/b-1"]
    assert b_page.status_code == 503 and _is_code(_error_code(b_page))

    health = pages["/health.json"]
    assert health.status_code == 200 and health.headers["content-type"].startswith("application/json")
    body = health.json()
    assert body["stores"]["a"]["revision"] >= 1 and "error" not in body["stores"]["a"]
    assert _is_code(body["stores"]["b"]["error"])
    assert body["stores"]["b"]["database"].split("://")[0] == urls["b"].split("://")[0]

    for r in pages.values():
        assert PASSWORD not in r.text and "Traceback" not in r.text
    assert PASSWORD not in json.dumps(stats) and PASSWORD not in json.dumps(gone)
    assert "Traceback" not in err and "Exception in thread" not in err and PASSWORD not in err, err[-3000:]

    for path, r in back.items():
        assert r.status_code == 200, (path, r.status_code)
        assert not DOWN_MARK.search(r.text), path
    assert "b-after" in back["/"].text
    assert "error" not in back["/health.json"].json()["stores"]["b"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_one_store_down_leaves_the_others_pages_and_live_updates_working(
        make_db_url: Any, backend: str, capfd: pytest.CaptureFixture[str]) -> None:
    """Before: with store ``b``'s database gone (its SQLite file moved away, its PostgreSQL schema
    renamed away), every page of the console was a 500, a run page of the healthy store ``a`` too,
    since each page first read every store's feed position; the stream sent only a console-wide
    ``unavailable``. Now only ``b``'s own run page is a 503 (its database cannot be reached); the
    rest render ``a`` and mark ``b`` with its error code."""
    urls = {"a": make_db_url(), "b": _with_password(make_db_url())}
    _seed(urls)
    _check_partial_outage(urls, lambda: store_gone(urls["b"]), capfd)


def test_one_store_on_a_stopped_server_leaves_the_others_working(
        tmp_path: Path, private_server: PrivateServer, capfd: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    """Store ``b`` on a PostgreSQL server of its own, stopped and started again (PostgreSQL only:
    a SQLite file has no server), beside a healthy SQLite store ``a``."""
    urls = {"a": f"sqlite:///{tmp_path / 'a.db'}", "b": _with_password(private_server.url)}
    _seed(urls)

    @contextmanager
    def stopped() -> Iterator[None]:
        private_server.stop()
        try:
            yield
        finally:
            private_server.start()

    _check_partial_outage(urls, stopped, capfd)


def test_every_store_down_is_a_503_naming_the_error(make_db_url: Any, backend: str) -> None:
    """With no store answering there is nothing to show: pages are a 503 (no database can be
    reached) naming a store's error code, and ``/health.json`` is a 503 in JSON with each store's error."""
    urls = {"a": make_db_url(), "b": make_db_url()}
    _seed(urls)
    with UiServer(create_app(urls, tick=0.2, poll_interval=0.3)) as console:
        with store_gone(urls["a"]), store_gone(urls["b"]):
            pages = {path: _get(console, path) for path in OVERVIEW}
            health = _get(console, "/health.json")
            time.sleep(0.3)
    for path, r in pages.items():
        assert r.status_code == 503 and _is_code(_error_code(r)), (path, _error_code(r))
    assert health.status_code == 503 and health.headers["content-type"].startswith("application/json")
    assert set(health.json()["stores"]) == {"a", "b"}
    assert all(_is_code(s["error"]) for s in health.json()["stores"].values())


def test_down_names_only_stores_of_the_console(make_db_url: Any) -> None:
    """``/events?down=`` names stores the page was rendered without, each once (else ``400``). A
    store this console does not serve is of a page another console rendered (it restarted over
    other stores): the stream resets, so the page reloads rather than retrying a 400 for ever."""
    urls = {"a": make_db_url(), "b": make_db_url()}
    _seed(urls)

    def reset(console: Any, down: str) -> bool:
        with httpx.stream("GET", console.url + "/events", params={"down": down}, timeout=5) as r:
            assert r.status_code == 200, down
            for line in r.iter_lines():
                if line.startswith("event: "):
                    return line == "event: reset"
        return False

    with UiServer(create_app(urls, tick=0.2, poll_interval=0.3)) as console:
        for down in ("a,a", ",a", ""):
            r = httpx.get(console.url + "/events?down=" + down + ",", timeout=5)
            assert r.status_code == 400 and _error_code(r) == "invalid_options", down
        for down in ("c", "a,c"):
            assert reset(console, down), down
    with UiServer(create_app(urls["a"], tick=0.2, poll_interval=0.3)) as console:
        assert reset(console, "a")


def test_an_open_page_names_the_store_down_and_reloads_once_it_is_back(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    """In a browser (SQLite only: the page's script is what is tested, the fault is the same on
    both backends): an open page's badge names the store that stopped answering and stays live
    for the other, whose new runs keep arriving; a page opened meanwhile marks the store and,
    once the store answers again, reloads by itself and lists its runs."""
    urls = {"a": f"sqlite:///{tmp_path / 'a.db'}", "b": f"sqlite:///{tmp_path / 'b.db'}"}
    _seed(urls)
    badge = "return document.getElementById('live').textContent;"
    with UiServer(create_app(urls, tick=0.2, poll_interval=0.3)) as console:
        browser.get(console.url + "/")
        _until(browser, "the page is live", lambda d: d.execute_script(badge) == "live")
        with store_gone(urls["b"]):
            _until(browser, "the badge names the store down",
                   lambda d: d.execute_script(badge) == "live · not answering: b")
            with fencepost.open(urls["a"]) as writer:
                writer.runs.create("a-live", '{"flowName": "f"}')
            _until(browser, "a run of the healthy store arrives",
                   lambda d: d.find_elements("css selector", 'tr[data-run-id="a-live"]'))
            browser.get(console.url + "/")
            assert browser.find_elements("css selector", 'section.store-down[data-store="b"]')
            assert not browser.find_elements("css selector", 'tr[data-store="b"]')
            browser.execute_script("window.notReloaded = true;")
        _until(browser, "the page reloads with the store back",
               lambda d: not d.execute_script("return window.notReloaded === true;")
               and d.find_elements("css selector", 'tr[data-run-id="b-1"][data-store="b"]'))
        assert not browser.find_elements("css selector", "section.store-down")
        _until(browser, "the page is live", lambda d: d.execute_script(badge) == "live")
