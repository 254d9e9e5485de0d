"""Every run id the store accepts reaches its run page through the console's own links, over HTTP, on
both backends: newlines and other control characters, dot segments, slashes, percent signs, query and
fragment characters, backslashes, non-ASCII text and the longest id."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httpx
import pytest

import fencepost
from fencepost._printable import printable
from fencepost.ui import create_app
from fencepost.ui.server import UiServer

from .conftest import PENDING, TESTER, unescape

#: Run ids the store accepts (any text but NUL and lone surrogates, 1..1024 UTF-16 units).
ODD_IDS = [
    "a\nb", "a\rb", "a\r\nb", "x\n", "\n", "\t", " ", " lead and trail ", "\x01\x1b[31m\x7f",
    ".", "..", "...", ".a", "a/../b", "./x", "x/.", "x/..", "../..", "a/b", "/lead", "trail/", "//",
    "%", "100%", "%2e%2e", "%2E", "%0A", "%252e", "a?b#c", "a b+c&d=e;f", "a\\b", "..\\..", "\\",
    "ünï✓", "🙂", "日本/語", "x" * 1024, "界" * 1024, "\n" * 1024,
]
ROW = re.compile(r'<tr data-run-id="([^"]*)"(?: data-store="([^"]*)")?[^>]*>.*?<a href="([^"]*)"', re.S)
TITLE = re.compile(r'<h1>run <span class="mono">(.*?)</span>', re.S)
BODY_ID = re.compile(r'<body data-page="run"[^>]* data-run-id="([^"]*)"')


def _create(url: str, ids: list[str]) -> None:
    with fencepost.open(url) as store:
        for run_id in ids:
            store.runs.create(run_id, '{"flowName": "odd-ids"}')


def _resolve(base: str, href: str) -> str:
    """``href`` as a browser resolves it, refusing what a browser would change: a dot segment (also
    percent-encoded), a backslash, a control character or a space."""
    assert href.startswith("/") and not href.startswith("//"), href
    assert not re.search(r"[\x00-\x20\x7f\\]", href), href
    path = urlsplit(href).path
    for segment in path.split("/"):
        assert segment.lower().replace("%2e", ".") not in (".", ".."), href
    return base + href


def _page(base: str, href: str) -> httpx.Response:
    return httpx.get(_resolve(base, href), timeout=20, follow_redirects=False)


def _shown(response: httpx.Response) -> str:
    """The run id a run page is about (the id its live updates follow; its title shows that id as
    the CLI does, a control character written ``\\x1b``)."""
    assert response.status_code == 200, (response.status_code, response.text[:300])
    title = TITLE.search(response.text)
    assert title is not None, response.text[:300]
    body = BODY_ID.search(response.text)
    if body is None:  # a fragment: its title alone
        return unescape(title.group(1))
    assert printable(unescape(body.group(1))) == unescape(title.group(1))
    return unescape(body.group(1))


def _fragment(href: str) -> str:
    return href + ("&" if "?" in href else "?") + "fragment=1"


@pytest.fixture
def served(db_url: str) -> Iterator[str]:
    _create(db_url, ODD_IDS)
    with UiServer(create_app(db_url, tick=0.2, poll_interval=0.5)) as server:
        yield server.url


def test_every_run_id_is_reached_from_the_runs_listing(served):
    listing = httpx.get(served + "/", params={"limit": "200"}, timeout=20)
    assert listing.status_code == 200
    rows = {unescape(run_id): unescape(href) for run_id, _, href in ROW.findall(listing.text)}
    assert set(rows) == set(ODD_IDS)
    for run_id, href in rows.items():
        assert _shown(_page(served, href)) == run_id, (run_id, href)
        fragment = _page(served, _fragment(href))  # what the run page fetches when the run changes
        assert fragment.status_code == 200 and "<html" not in fragment.text, run_id
        assert _shown(fragment) == printable(run_id)


def test_the_documented_address_reaches_every_run_but_the_dot_ones(served):
    """``/runs/<run id>``, the id percent-encoded, for every id a browser keeps in a path."""
    for run_id in ODD_IDS:
        if run_id in (".", ".."):
            href = "/runs/?id=" + quote(run_id, safe="")
        else:
            href = "/runs/" + quote(run_id, safe="")
        assert _shown(_page(served, href)) == run_id, run_id
    r = httpx.get(served + "/runs/" + quote("a\nb/c", safe=""), timeout=20)
    assert r.status_code == 404 and 'id="error-code">not_found_row<' in r.text


def test_health_and_lineage_links_reach_the_run(served, db_url):
    with fencepost.open(db_url) as store:
        store.runs.create("x/../y\n", '{"flowName": "odd-ids"}')
        store.runs.claim_and_own("x/../y\n", PENDING, TESTER, store.clock.now_ms())
    text = httpx.get(served + "/health", timeout=20).text
    link = re.search(r'data-field="oldest_heartbeat"><a href="([^"]*)">', text)
    assert link is not None, text[:2000]
    assert _shown(_page(served, unescape(link.group(1)))) == "x/../y\n"
    for run_id in ("..", "a\nb", "a/../b"):
        page = _page(served, "/runs/?id=" + quote(run_id, safe=""))
        lineage = re.search(r'<table class="lineage".*?</table>', page.text, re.S)
        assert lineage is not None
        href = unescape(re.search(r'<a href="([^"]*)"', lineage.group(0)).group(1))
        assert _shown(_page(served, href)) == run_id


@pytest.fixture
def two_stores(make_db_url: Any) -> Iterator[str]:
    one, two = make_db_url(), make_db_url()
    _create(one, ["only-in-one", "in-both\n"])
    _create(two, [*ODD_IDS, "in-both\n"])
    with UiServer(create_app({"one": one, "two": two}, tick=0.2, poll_interval=0.5)) as server:
        yield server.url


def test_every_run_id_is_reached_across_several_stores(two_stores):
    listing = httpx.get(two_stores + "/", params={"limit": "200"}, timeout=20)
    assert listing.status_code == 200
    rows = [(unescape(run_id), store, unescape(href)) for run_id, store, href in ROW.findall(listing.text)]
    assert sorted((r, s) for r, s, _ in rows) == sorted(
        [(r, "two") for r in ODD_IDS] + [("only-in-one", "one"), ("in-both\n", "one"), ("in-both\n", "two")])
    for run_id, store, href in rows:
        assert unquote(href).startswith(f"/runs/{store}/"), href
        page = _page(two_stores, href)
        assert _shown(page) == run_id and f'id="run-store">{store}<' in page.text, (run_id, href)
        assert _shown(_page(two_stores, _fragment(href))) == printable(run_id)
    # Without the store: redirected to the one store that holds the run, at an address that reaches it.
    for run_id in ODD_IDS:
        href = "/runs/?id=" + quote(run_id, safe="") if run_id in (".", "..") else "/runs/" + quote(run_id, safe="")
        moved = _page(two_stores, href)
        assert moved.status_code == 307, (run_id, moved.status_code)
        target = moved.headers["location"]
        assert _shown(_page(two_stores, target)) == run_id, (run_id, target)
        assert unquote(target).startswith("/runs/two/")
    ambiguous = _page(two_stores, "/runs/" + quote("in-both\n", safe=""))
    assert ambiguous.status_code == 409 and 'id="error-code">ambiguous_run<' in ambiguous.text


def test_a_run_id_with_a_newline_has_its_page(served):
    """The reported case: ``fencepost runs create $'a\\nb'``, linked as /runs/a%0Ab."""
    r = httpx.get(served + "/runs/a%0Ab", timeout=20)
    assert _shown(r) == "a\nb"


@pytest.mark.parametrize("path", ["/runs/../journal", "/runs/%2e%2e/journal", "/runs/a/.%2E/b", "/runs/./x",
                                  "/runs/a%00b", "/runs/x/%2E"])
def test_a_path_a_browser_would_resolve_or_a_nul_is_still_refused_under_runs(served, path):
    """A run's address holds no such segment (the console links ``.`` and ``..`` as ``?id=``)."""
    import http.client

    conn = http.client.HTTPConnection(served.removeprefix("http://"), timeout=10)
    conn.putrequest("GET", path, skip_accept_encoding=True)
    conn.endheaders()
    response = conn.getresponse()
    body = response.read()
    conn.close()
    assert response.status == 400 and b'id="error-code">invalid_path<' in body, (path, response.status)
