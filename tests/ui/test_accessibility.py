"""Accessibility basics of every page, over HTTP on both backends: a title naming the page, one
``h1``, the active navigation link marked for assistive technology (not by colour alone), and the
live badge announced when it changes ("database unavailable" is news a screen reader must hear)."""

from __future__ import annotations

import re

import httpx
import pytest

PAGES = {"/": "Runs", "/journal": "Journal", "/projections": "Projections", "/health": "Health"}


@pytest.mark.parametrize("path", list(PAGES))
def test_each_page_has_a_title_one_heading_a_current_link_and_an_announced_badge(console, path):
    html = httpx.get(console.url + path, timeout=20).text
    assert re.search(rf"<title>{PAGES[path]} · fencepost console</title>", html)
    assert html.count("<h1") == 1
    current = re.findall(r'<a href="([^"]*)"[^>]*aria-current="page"', html)
    assert current == [path], current
    badge = re.search(r'<span id="live"[^>]*>', html)
    assert badge and 'role="status"' in badge.group(0), badge
