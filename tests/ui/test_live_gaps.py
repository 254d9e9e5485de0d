"""What a page missed between being rendered and its event stream opening, the started/finished
columns of a row that changes live, and repeated query parameters. Both backends; the live tests in
headless Chromium."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from html import unescape
from typing import Any

import httpx
import pytest

import fencepost
from fencepost.ui import create_app, views
from fencepost.ui.server import UiServer

from .conftest import PENDING, TESTER
from .test_browser import _until, browser  # noqa: F401  (the browser fixture)


class HoldEvents:
    """The console with its ``/events`` requests held until ``release`` is set: the window between a
    page being rendered and its stream opening, made as long as the test needs."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state = app.state  # UiServer closes the hub through it
        self.held = threading.Event()
        self.release = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/events":
            self.held.set()
            deadline = time.monotonic() + 20
            while not self.release.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        await self.app(scope, receive, send)


def _hub_reached(app: Any, store: fencepost.Store) -> None:
    """Wait until the console's follower has broadcast everything the store holds."""
    target = store.feed.position().revision
    deadline = time.monotonic() + 10
    while app.state.hub.position is None or app.state.hub.position.revision < target:
        assert time.monotonic() < deadline, "the console's follower did not catch up"
        time.sleep(0.02)


_ROW = ("for (const tr of document.querySelectorAll('#runs tr[data-run-id]')) {"
        "  if (tr.dataset.runId === arguments[0]) return [tr.querySelector('.status').textContent.trim(),"
        "    tr.children[6].textContent.trim(), tr.children[7].textContent.trim()]; }"
        "return null;")


def test_a_change_between_render_and_stream_open_reaches_the_page(db_url: str, browser: Any) -> None:  # noqa: F811
    """The page rendered the runs at position P; its stream opened at the follower's position Q > P,
    so what changed in between was never shown: a run stayed "pending" on screen although it was
    running, until a manual reload. The page now tells the stream the position it rendered at and
    gets the changes after it first, without reloading."""
    with fencepost.open(db_url) as store:
        store.runs.create("gap-row", "{}")
        store.runs.create("gap-page", "{}")
        app = create_app(db_url, tick=0.2, poll_interval=0.2)
        gate = HoldEvents(app)
        with UiServer(gate) as server:
            browser.get(server.url + "/")
            assert gate.held.wait(10)
            assert browser.execute_script(_ROW, "gap-row")[0] == "pending"
            browser.execute_script("window.__notReloaded = true;")
            store.runs.claim_and_own("gap-row", PENDING, TESTER, store.clock.now_ms())
            _hub_reached(app, store)  # broadcast before the page's stream subscribed
            gate.release.set()
            _until(browser, "the row shows running", lambda d: d.execute_script(_ROW, "gap-row")[0] == "running")
            assert browser.execute_script("return window.__notReloaded === true;")

            gate.release.clear()
            gate.held.clear()
            browser.get(server.url + "/runs/gap-page")
            assert gate.held.wait(10)
            store.runs.claim_and_own("gap-page", PENDING, TESTER, store.clock.now_ms())
            _hub_reached(app, store)
            gate.release.set()
            _until(browser, "the run page shows running", lambda d: d.execute_script(
                "const s = document.getElementById('run-status'); return s !== null && s.textContent.trim();")
                == "running")


def test_a_stream_far_behind_the_page_position_resets_once(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream asked to start from a position too far behind (more changes than it replays) or of
    another source is told to ``reset`` (the page reloads), once; a position it can replay gets the
    changes after it, then ``hello`` at the position reached."""
    from fencepost.ui import hub

    from .conftest import EventStream

    monkeypatch.setattr(hub, "CATCH_UP_LIMIT", 1)  # one change replayed, more is too far behind
    with fencepost.open(db_url) as store:
        store.runs.create("catch-0", "{}")
        rendered = store.feed.position()
        store.runs.create("catch-1", "{}")
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.2)) as server:
            stream = EventStream(server.url, since=rendered)
            try:
                seen = []
                while True:
                    name, data, _ = stream.wait(lambda n, d: n in ("run", "hello"), 5)
                    seen.append((name, data.get("run_id")))
                    if name == "hello":
                        break
                assert seen == [("run", "catch-1"), ("hello", None)]
                assert data["revision"] == store.feed.position().revision
            finally:
                stream.close()
            for since, reason in ((f"{'0' * 32}:1", "source_changed"), (f"{rendered.source}:0", "too_far_behind")):
                r = httpx.get(server.url + "/events", params={"since": since}, timeout=5)
                assert r.status_code == 200
                assert r.text.count("event: reset") == 1 and reason in r.text, r.text[:300]
                assert "event: run" not in r.text


@pytest.mark.parametrize("since", ["x", "abc:1", "0" * 32, "0" * 32 + ":-1", "0" * 32 + ":1.5", "=" + "0" * 32 + ":1",
                                   "0" * 32 + ":" + "9" * 17])
def test_a_malformed_since_is_refused_naming_it(db_url: str, since: str) -> None:
    """A ``since`` that is no feed position is a 400 naming the parameter, not a stream."""
    with fencepost.open(db_url):
        pass
    with UiServer(create_app(db_url, tick=0.2, poll_interval=0.2)) as server:
        r = httpx.get(server.url + "/events", params={"since": since}, timeout=5)
        assert r.status_code == 400
        code, detail = _error(r)
        assert code == "invalid_options" and detail.startswith("since must be"), detail


def test_a_row_that_starts_or_settles_live_shows_its_times(db_url: str, browser: Any) -> None:  # noqa: F811
    """A row that started running live kept "started: -" (and a settled one "finished: -") until a
    reload: only status, owner and cancellation changed in place."""
    with fencepost.open(db_url) as store:
        store.runs.create("times", "{}")
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.2)) as server:
            browser.get(server.url + "/")
            _until(browser, "the page is live",
                   lambda d: d.execute_script("return document.getElementById('live').textContent") == "live")
            assert browser.execute_script(_ROW, "times")[1:] == ["-", "-"]
            store.runs.claim_and_own("times", PENDING, TESTER, store.clock.now_ms())
            started = views.when(store.runs.get("times").started_at_ms)
            _until(browser, "the started column shows the start",
                   lambda d: d.execute_script(_ROW, "times") == ["running", started, "-"])
            store.runs.transition_owned("times", TESTER, "completed")
            finished = views.when(store.runs.get("times").finished_at_ms)
            _until(browser, "the finished column shows the settlement",
                   lambda d: d.execute_script(_ROW, "times") == ["completed", started, finished])


def _error(r: httpx.Response) -> tuple[str, str]:
    code = re.search(r'<code id="error-code">([^<]*)</code>', r.text)
    detail = re.search(r'</code>: ([^<]*)</p>', r.text)
    assert code and detail, r.text[:500]
    return code.group(1), unescape(detail.group(1))


@pytest.mark.parametrize(("path", "name", "query"), [
    ("/", "flow", "flow=a&flow=b"),
    ("/", "created_after", "created_after=1&created_after=2"),
    ("/", "created_before", "created_before=1&created_before=2"),
    ("/", "limit", "limit=5&limit=10"),
    ("/", "cursor", "cursor=x&cursor=y"),
    ("/runs/", "id", "id=rep-1&id=rep-2"),
    ("/runs/rep-1", "fragment", "fragment=1&fragment=0"),
    ("/events", "since", "since=x&since=y"),
])
def test_a_repeated_query_parameter_is_refused_naming_it(db_url: str, path: str, name: str, query: str) -> None:
    """``?flow=a&flow=b`` silently took the last value (a page filtered by something else than
    asked); a parameter given twice is now a 400 naming it, on every page that reads it."""
    with fencepost.open(db_url) as store:
        store.runs.create("rep-1", '{"flowName": "a"}')
        store.runs.create("rep-2", '{"flowName": "b"}')
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.2)) as server:
            r = httpx.get(server.url + path + "?" + query, timeout=5)
            assert r.status_code == 400, r.text[:300]
            code, detail = _error(r)
            assert code == "invalid_options"
            assert detail.startswith(f"{name} ") and "more than once" in detail, detail


def test_several_statuses_filter_by_each(db_url: str) -> None:
    """``?status=a&status=b`` listed only status b (the last); the listing filters by several
    statuses, so the page now lists the runs in either, and its next page keeps both."""
    with fencepost.open(db_url) as store:
        for i in range(3):
            store.runs.create(f"st-p{i}", "{}")
        store.runs.create("st-r", "{}")
        store.runs.claim_and_own("st-r", PENDING, TESTER, store.clock.now_ms())
        store.runs.create("st-c", "{}")
        store.runs.claim_and_own("st-c", PENDING, TESTER, store.clock.now_ms())
        store.runs.transition_owned("st-c", TESTER, "completed")
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.2)) as server:
            r = httpx.get(server.url + "/?status=running&status=completed", timeout=5)
            assert r.status_code == 200
            assert set(re.findall(r'<tr data-run-id="([^"]+)"', r.text)) == {"st-r", "st-c"}
            r = httpx.get(server.url + "/?status=running&status=pending&limit=2", timeout=5)
            first = re.findall(r'<tr data-run-id="([^"]+)"', r.text)
            nxt = re.search(r'<a id="next-page" href="/\?([^"]+)"', r.text)
            assert nxt, r.text[-800:]
            r = httpx.get(server.url + "/?" + unescape(nxt.group(1)), timeout=5)
            assert r.status_code == 200, r.text[:300]
            second = re.findall(r'<tr data-run-id="([^"]+)"', r.text)
            assert set(first + second) == {"st-r", "st-p0", "st-p1", "st-p2"} and len(first + second) == 4
            r = httpx.get(server.url + "/?status=running&status=nope", timeout=5)
            assert r.status_code == 400 and _error(r)[0] == "invalid_options"
