"""Odd run ids in a real browser: the links the server renders and the ones the page's script builds
for runs that appear live reach the run's page, and a run page (or a runs row) whose id holds a
carriage return or is ``..`` still updates live. Skips or fails as ``test_browser`` does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import fencepost
from fencepost.ui import create_app
from fencepost.ui.server import UiServer

from .conftest import PENDING, TESTER
from .test_browser import _until, browser  # noqa: F401  (the browser fixture)

RENDERED = ["a\rb", "a\nb", "x/.", "a/../b", "%2e%2e", "a?b#c", "a\\b", "c\r\nd", " ", "\t", "\n", "\x01",
            "".join(chr(c) for c in range(1, 0x20)) + "\x7f\x85"]
LIVE = [".", "..", "e\rf", "g/../h\n"]


def _live(d: Any) -> bool:
    return d.execute_script("const l = document.getElementById('live'); return l !== null && l.textContent === 'live';")


def _open_from_runs_page(driver: Any, run_id: str) -> None:
    """Click the link of ``run_id``'s row on the runs page; wait for that run's page."""
    link = driver.execute_script(
        "for (const tr of document.querySelectorAll('#runs tr[data-run-id]')) {"
        "  if (tr.dataset.runId === arguments[0]) return tr.querySelector('a'); }"
        "return null;", run_id)
    assert link is not None, f"no row for {run_id!r}"
    link.click()
    _until(driver, f"the page of {run_id!r} opens", lambda d: d.execute_script(
        "return document.body.dataset.page === 'run' && document.body.dataset.runId === arguments[0]"
        " && document.getElementById('run-status') !== null;", run_id))


def _rows_of(driver: Any, run_id: str) -> int:
    return driver.execute_script(
        "let n = 0; for (const tr of document.querySelectorAll('#runs tr[data-run-id]')) {"
        "  if (tr.dataset.runId === arguments[0]) n++; } return n;", run_id)


def _status_of(driver: Any, run_id: str) -> str | None:
    return driver.execute_script(
        "for (const tr of document.querySelectorAll('#runs tr[data-run-id]')) {"
        "  if (tr.dataset.runId === arguments[0]) return tr.querySelector('.status').textContent.trim(); }"
        "return null;", run_id)


@pytest.fixture
def odd(db_url: str) -> Iterator[tuple[str, fencepost.Store]]:
    with fencepost.open(db_url) as store:
        for run_id in RENDERED:
            store.runs.create(run_id, '{"flowName": "odd-ids"}')
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.5)) as server:
            yield server.url, store


def test_odd_run_ids_in_a_real_browser(odd, browser):  # noqa: F811
    url, store = odd
    for run_id in RENDERED:
        browser.get(url + "/")
        _until(browser, "the runs page is live", _live)
        _open_from_runs_page(browser, run_id)

    browser.get(url + "/")
    _until(browser, "the runs page is live", _live)
    browser.execute_script("window.__notReloaded = true;")
    for run_id in LIVE:
        store.runs.create(run_id, '{"flowName": "odd-ids"}')
    for run_id in LIVE:
        _until(browser, f"a row for {run_id!r} appears", lambda d, r=run_id: _status_of(d, r) == "pending")
    store.runs.claim_and_own("a\rb", PENDING, TESTER, store.clock.now_ms())
    _until(browser, "the row of 'a\\rb' shows running", lambda d: _status_of(d, "a\rb") == "running")
    assert _rows_of(browser, "a\rb") == 1  # updated in place, not added again
    assert browser.execute_script("return window.__notReloaded === true;")
    for run_id in LIVE:  # links the page's script built
        browser.get(url + "/")
        _until(browser, "the runs page is live", _live)
        _open_from_runs_page(browser, run_id)

    for run_id in ("a\rb", ".."):
        browser.get(url + "/")
        _until(browser, "the runs page is live", _live)
        _open_from_runs_page(browser, run_id)
        _until(browser, "the run page is live", _live)
        browser.execute_script("window.__notReloaded = true;")
        if store.runs.get(run_id).status == "pending":
            store.runs.claim_and_own(run_id, PENDING, TESTER, store.clock.now_ms())
        store.runs.transition_owned(run_id, TESTER, "completed")
        _until(browser, f"the page of {run_id!r} shows completed", lambda d: d.execute_script(
            "const s = document.getElementById('run-status');"
            "return s !== null && s.textContent.trim() === 'completed';"))
        assert browser.execute_script("return window.__notReloaded === true;")
    severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert severe == []
