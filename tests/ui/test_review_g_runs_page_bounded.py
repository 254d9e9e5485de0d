"""The newest runs page left open on a busy store stays bounded, in a real browser.

Skips or fails as ``test_browser`` does (``FENCEPOST_REQUIRE_BROWSER=1`` fails without a browser).
"""

from __future__ import annotations

from typing import Any

from .conftest import PENDING, TESTER, new_run
from .test_browser import _until, browser  # noqa: F401  (the browser fixture)

LIMIT = 4


def _row_ids(d: Any) -> list[str]:
    return d.execute_script(
        "return [...document.querySelectorAll('#runs tr[data-run-id]')].map((t) => t.dataset.runId);")


def _notice(d: Any) -> str | None:
    return d.execute_script(
        "const p = document.getElementById('newer-runs'); return p === null || p.hidden ? null : p.textContent.trim();")


def _status_of(d: Any, run_id: str) -> str | None:
    return d.execute_script(
        "for (const tr of document.querySelectorAll('#runs tr[data-run-id]')) {"
        "  if (tr.dataset.runId === arguments[0]) return tr.querySelector('.status').textContent.trim(); }"
        "return null;", run_id)


def _live(d: Any) -> bool:
    return d.execute_script("const l = document.getElementById('live'); return l !== null && l.textContent === 'live';")


def test_newest_page_takes_one_page_of_live_runs_then_counts_the_rest(console, writer, browser):  # noqa: F811
    """Defect (found by a review, SQLite and PostgreSQL): every run created while the newest runs
    page was open was added at its top and no row ever left, so a tab open on a busy store grew
    without bound (1 550 rows for a 50-row page). Now the page takes up to one page of live runs
    (``limit``); past that, a notice counts the newer runs (each once, a deleted one uncounted) and
    links to the newest page. No row is dropped, so "older runs →" still leads to the runs right
    after the last row shown."""
    from selenium.webdriver.common.by import By

    browser.get(f"{console.url}/?limit={LIMIT}")
    _until(browser, "the runs page is live", _live)
    rendered = _row_ids(browser)
    assert len(rendered) == LIMIT
    after_rendered = [r.run_id for r in writer.feed.list_runs(None, None, 2 * LIMIT, newest_first=True).runs][LIMIT:]
    browser.execute_script("window.__notReloaded = true;")

    created = [new_run(writer, "ui-bounded") for _ in range(3 * LIMIT)]
    _until(browser, "the runs past one page are counted", lambda d: _notice(d) == (
        f"{2 * LIMIT} newer runs not shown: show the newest"))
    assert _row_ids(browser) == [*reversed(created[:LIMIT]), *rendered]
    assert browser.execute_script("return window.__notReloaded === true;")  # live, not a reload

    # A shown live row still follows its run; a counted run that changes is not counted again, a
    # deleted one is uncounted, the next new one is counted.
    writer.runs.claim_and_own(created[0], PENDING, TESTER, writer.clock.now_ms())
    writer.runs.claim_and_own(created[-1], PENDING, TESTER, writer.clock.now_ms())
    writer.runs.delete(created[-2])
    _until(browser, "a shown live row follows its run", lambda d: _status_of(d, created[0]) == "running")
    _until(browser, "a deleted run is uncounted", lambda d: _notice(d) == (
        f"{2 * LIMIT - 1} newer runs not shown: show the newest"))
    last = new_run(writer, "ui-bounded")
    _until(browser, "the next new run is counted", lambda d: _notice(d) == (
        f"{2 * LIMIT} newer runs not shown: show the newest"))
    assert len(_row_ids(browser)) == 2 * LIMIT and _status_of(browser, last) is None

    newest_href = browser.find_element(By.CSS_SELECTOR, "#newer-runs a").get_attribute("href")
    browser.find_element(By.ID, "next-page").click()
    _until(browser, "the next page is live", lambda d: "cursor=" in d.current_url and _live(d))
    assert _row_ids(browser) == after_rendered

    browser.get(newest_href)
    _until(browser, "the newest page is live", lambda d: "cursor=" not in d.current_url and _live(d))
    newest = [r.run_id for r in writer.feed.list_runs(None, None, LIMIT, newest_first=True).runs]
    assert _row_ids(browser) == newest and newest[0] == last
