"""The runs page's filter form keeps the page size it was opened with, on both backends.

At ``/?limit=5`` the form submitted status, flow and the created range only: filtering went back
to 50 rows a page, and so did every "older runs →" after it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import fencepost
from fencepost.ui import create_app
from fencepost.ui.server import UiServer

from .test_browser import _until, browser  # noqa: F401  (the browser fixture)


def test_filtering_keeps_the_page_size(db_url: str, browser: Any) -> None:  # noqa: F811
    with fencepost.open(db_url) as store:
        for i in range(8):
            store.runs.create(f"form-{i}", '{"flowName": "%s"}' % ("wanted" if i % 2 else "other"))
    with UiServer(create_app(db_url, tick=0.2)) as console:
        browser.get(console.url + "/?limit=3")
        field = browser.find_element("css selector", "form.filters input[name=flow]")
        field.send_keys("wanted")
        browser.find_element("css selector", "form.filters button[type=submit]").click()
        _until(browser, "the filtered page", lambda d: "flow=wanted" in d.current_url)
        assert parse_qs(urlsplit(browser.current_url).query).get("limit") == ["3"], browser.current_url
        ids = browser.execute_script(
            "return [...document.querySelectorAll('#runs tr[data-run-id]')].map((tr) => tr.dataset.runId);")
        assert ids == ["form-7", "form-5", "form-3"], ids
        browser.find_element("id", "next-page").click()
        _until(browser, "the next page", lambda d: "cursor=" in d.current_url)
        ids = browser.execute_script(
            "return [...document.querySelectorAll('#runs tr[data-run-id]')].map((tr) => tr.dataset.runId);")
        assert ids == ["form-1"], ids
    # Without a limit given, the form adds none.
    with UiServer(create_app(db_url, tick=0.2)) as console:
        browser.get(console.url + "/")
        browser.find_element("css selector", "form.filters input[name=flow]").send_keys("wanted")
        browser.find_element("css selector", "form.filters button[type=submit]").click()
        _until(browser, "the filtered page", lambda d: "flow=wanted" in d.current_url)
        assert "limit" not in parse_qs(urlsplit(browser.current_url).query), browser.current_url
