"""The projections page, open while a projection is first built or rebuilt, on both backends.

The page updated only the figures of the rows it was rendered with: opened before any projection
had a checkpoint ("no projection has a checkpoint on this database"), it said so for as long as it
stayed open, while ``fencepost projection run`` built one and the health page counted the writes;
and a rebuild left its rebuild history as rendered. A projection the page has no row for, or a
rebuild count that grew, now has the page reload itself once.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.support.ui import WebDriverWait

import fencepost
from fencepost.projections import ProjectionBuilder, RunsByStatus
from fencepost.ui import create_app
from fencepost.ui.server import UiServer

from .test_browser import browser  # noqa: F401  (the browser fixture)

#: Stats are sent at least every 5 s when nothing moved: room for one round and a reload.
WAIT_S = 12.0


def _until(driver: Any, what: str, condition: Any) -> None:
    try:
        WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition)
    except TimeoutException:
        raise AssertionError(f"within {WAIT_S} s: {what}") from None


@pytest.mark.parametrize("several", [False, True])
def test_an_open_projections_page_shows_a_projection_built_meanwhile(
        db_url: str, make_db_url: Any, browser: Any, several: bool) -> None:  # noqa: F811
    other = make_db_url() if several else None
    for url in filter(None, (db_url, other)):
        with fencepost.open(url) as store:
            store.runs.create("p-1", "{}")
    app = create_app({"a": db_url, "b": other} if several else db_url, tick=0.2, poll_interval=0.3)
    with UiServer(app) as console, fencepost.open(db_url) as store:
        browser.get(console.url + "/projections")
        assert "no projection has a checkpoint" in browser.find_element("tag name", "main").text
        browser.execute_script("window.notReloaded = true;")
        with ProjectionBuilder(store, db_url, RunsByStatus()) as builder:
            builder.catch_up()
            _until(browser, "the new projection's row", lambda d: d.execute_script(
                "return document.querySelector('tr[data-projection=\"runs_by_status\"]') !== null;"))
            assert browser.execute_script("return window.notReloaded === undefined;")
            # The page stays put once it shows every projection: no reload loop.
            browser.execute_script("window.notReloaded = true;")
            time.sleep(1.5)
            assert browser.execute_script("return window.notReloaded === true;")
            # A rebuild: its history (not in the live figures) shows without a manual reload.
            builder.rebuild()
            _until(browser, "the rebuild's history", lambda d: d.execute_script(
                "const m = document.querySelector('main');"
                "return m !== null && m.textContent.includes('Rebuild history')"
                "  && !m.textContent.includes('never rebuilt');"))
