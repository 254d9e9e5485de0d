"""The runs page and a run's page in a real browser, with data a real store holds: a run id or flow
name holding a bidi override, a zero-width or a control character shows it visibly (``\\u202e``,
as the CLI does) instead of reordering the page around it; the longest run id wraps instead of
pushing the page's columns off screen; an old run changing status does not jump to the top of the
newest page. Both backends at once: one console over a SQLite and a PostgreSQL store, one browser
session. Skips or fails as ``test_browser`` does."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencepost
from fencepost.ui import create_app
from fencepost.ui.server import UiServer
from tests.conftest import drop_schema, require_postgres

from .conftest import PENDING, TESTER
from .test_browser import _until, browser  # noqa: F401  (the browser fixture)

BIDI = "evil\u202eexe.txt"  # shows as "eviltxt.exe" when the override is applied
LONG = "L" * 1024  # the longest id the store takes, with no place to break
LIVE = "live\u2067x\u200b"  # right-to-left isolate and zero width space, arriving live
HIDDEN = ("\u202e", "\u2067", "\u200b", "\x1b")


@pytest.fixture
def mixed(tmp_path: Path) -> Iterator[tuple[str, dict[str, fencepost.Store]]]:
    schema = "t_" + uuid.uuid4().hex[:16]
    urls = {"lite": f"sqlite:///{tmp_path / 'lite.db'}", "pg": f"{require_postgres()}?schema={schema}"}
    writers = {name: fencepost.open(url) for name, url in urls.items()}
    try:
        for i in range(60):  # more than the first page holds (50)
            writers["lite"].runs.create(f"old-{i:02d}", '{"flowName": "old"}')
        writers["lite"].runs.create(BIDI, '{"flowName": "bidi\\u202eflow\\u001b[31m"}')
        writers["pg"].runs.create(LONG, '{"flowName": "long"}')
        with UiServer(create_app(urls, tick=0.2, poll_interval=0.3)) as server:
            yield server.url, writers
    finally:
        for w in writers.values():
            w.close()
        drop_schema(require_postgres(), schema)


def _live(d: Any) -> bool:
    return d.execute_script("const l = document.getElementById('live'); return l !== null && l.textContent === 'live';")


def _row_texts(d: Any, run_id: str) -> list[str] | None:
    return d.execute_script(
        "for (const tr of document.querySelectorAll('#runs tr[data-run-id]')) {"
        "  if (tr.dataset.runId === arguments[0]) return [...tr.cells].map((c) => c.textContent); }"
        "return null;", run_id)


def _hidden_in_page(d: Any) -> list[str]:
    text = d.execute_script("return document.title + document.body.innerText;")
    return [hex(ord(ch)) for ch in HIDDEN if ch in text]


def _fits(d: Any) -> bool:
    return d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth;")


def _row_ids(d: Any) -> list[str]:
    return d.execute_script(
        "return [...document.querySelectorAll('#runs tr[data-run-id]')].map((t) => t.dataset.runId);")


def test_hidden_characters_show_visibly_long_ids_wrap_and_old_runs_stay_off_the_newest_page(
        mixed, browser):  # noqa: F811
    url, writers = mixed
    browser.get(url + "/")
    _until(browser, "the runs page is live", _live)
    cells = _row_texts(browser, BIDI)
    assert cells is not None and cells[1] == "evil\\u202eexe.txt", cells
    assert cells[3] == "bidi\\u202eflow\\x1b[31m", cells
    assert _hidden_in_page(browser) == []
    assert _fits(browser), "the runs page is wider than the window"

    writers["pg"].runs.create(LIVE, '{"flowName": "bidi\\u2067live"}')
    _until(browser, "the live run's row appears", lambda d: _row_texts(d, LIVE) is not None)
    cells = _row_texts(browser, LIVE)
    assert cells[1] == "live\\u2067x\\u200b" and cells[3] == "bidi\\u2067live", cells
    assert _hidden_in_page(browser) == []

    # A run older than the whole page changes (a worker claims it): the page has no row for it, and
    # it used to be prepended as if new, so a busy store grew the newest page by a row a change.
    before = _row_ids(browser)
    assert "old-00" not in before
    writers["lite"].runs.claim_and_own("old-00", PENDING, TESTER, writers["lite"].clock.now_ms())
    writers["lite"].runs.create("after-claim", '{"flowName": "old"}')  # its event follows the claim's
    _until(browser, "the run created after the claim appears", lambda d: _row_texts(d, "after-claim") is not None)
    assert _row_ids(browser) == ["after-claim", *before]

    for store, run_id in (("lite", BIDI), ("pg", LONG), ("pg", LIVE)):
        browser.execute_script(
            "for (const tr of document.querySelectorAll('#runs tr[data-run-id]')) {"
            "  if (tr.dataset.runId === arguments[0]) { tr.querySelector('a').click(); return; } }", run_id)
        _until(browser, f"the page of {run_id[:12]!r} is live", lambda d, r=run_id: d.execute_script(
            "return document.body.dataset.runId === arguments[0];", r) and _live(d))
        assert browser.find_element("id", "run-store").text == store
        assert _hidden_in_page(browser) == [], run_id[:12]
        assert _fits(browser), f"the page of {run_id[:12]!r} is wider than the window"
        browser.back()
        _until(browser, "the runs page is live", _live)
    severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert severe == []
