"""The runs page's status counts over several stores never go back behind the page itself.

Each store's part of the ``stats`` event carries its own ``as_of`` (the feed position its counts
were read at) and its own ``counts``; the runs page keeps each store's counts and takes a store's
new ones only when they are not older than what the page already has of that store. Run on both
backends (the stores of one console are on the backend under test).
"""

from __future__ import annotations

from typing import Any

import fencepost
from fencepost.ui import create_app
from fencepost.ui.server import UiServer

from .conftest import EventStream
from .test_browser import _until, browser  # noqa: F401  (the browser fixture)

# Installed before the page's own script: every value the pending count takes after the render.
RECORD = """
window.pendingSeen = [];
document.addEventListener("DOMContentLoaded", () => {
  const el = document.querySelector('[data-count="pending"]');
  window.pendingRendered = el.textContent;
  new MutationObserver(() => window.pendingSeen.push(el.textContent))
    .observe(el, {childList: true, characterData: true, subtree: true});
});
"""
BADGE = "return document.getElementById('live').textContent;"
PENDING = "return document.querySelector('[data-count=\"pending\"]').textContent;"


def _seeded(make_db_url: Any) -> dict[str, str]:
    urls = {"a": make_db_url(), "b": make_db_url()}
    for name, url in urls.items():
        with fencepost.open(url) as store:
            store.runs.create(f"{name}-1", '{"flowName": "f"}')
    return urls


def test_each_stores_stats_carry_its_own_as_of_and_counts(make_db_url: Any) -> None:
    """Before: over several stores the ``stats`` event had no ``as_of`` at all, only counts summed
    over the stores. Now each store's part has ``as_of`` (its source and revision) and ``counts``;
    the summed ``counts`` stay."""
    urls = _seeded(make_db_url)
    with fencepost.open(urls["b"]) as writer:
        writer.runs.create("b-2", '{"flowName": "f"}')
        written = writer.feed.position()
    with UiServer(create_app(urls, tick=0.2, poll_interval=0.3)) as console:
        stream = EventStream(console.url)
        try:
            _, stats, _ = stream.wait(lambda n, d: n == "stats", 10)
        finally:
            stream.close()
    b = stats["stores"]["b"]
    assert b["as_of"] == {"source": written.source, "revision": written.revision}
    assert b["counts"]["pending"] == 2 and stats["stores"]["a"]["counts"]["pending"] == 1
    assert stats["counts"]["pending"] == 3


def test_a_stale_sample_does_not_take_a_stores_counts_back(make_db_url: Any, browser: Any) -> None:  # noqa: F811
    """Before: the hub's last sample, sent as the page's stream opens, was read before a run of
    store ``b`` that the page already counts; the page took its summed counts and the pending count
    went back (3, then 2, then 4). Now ``b``'s part is older than the page's position of ``b`` and
    is not taken, while ``a``'s is: the count stays 3 until a newer sample says 4."""
    urls = _seeded(make_db_url)
    app = create_app(urls, tick=0.2, poll_interval=0.3)
    hub = app.state.hub
    with UiServer(app) as console:
        stream = EventStream(console.url)
        try:
            stream.wait(lambda n, d: n == "stats" and all("health" in p for p in d["stores"].values()), 10)
        finally:
            stream.close()
        real = hub._stats_fn
        stale = hub.last_stats
        hub._stats_fn = lambda h: stale  # the hub's samples lag behind the stores (a slow stats read)
        with fencepost.open(urls["b"]) as writer:
            writer.runs.create("b-2", '{"flowName": "f"}')
        browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD})
        browser.get(console.url + "/")
        rendered = browser.execute_script("return window.pendingRendered;")
        # "live" once the stream's hello arrived; the stale sample follows it on the same stream.
        _until(browser, "the page is live", lambda d: d.execute_script(BADGE) == "live")
        hub._stats_fn = real
        with fencepost.open(urls["a"]) as writer:
            writer.runs.create("a-2", '{"flowName": "f"}')
        _until(browser, "a newer sample counts the new run", lambda d: d.execute_script(PENDING) == "4")
        seen = browser.execute_script("return window.pendingSeen;")
    assert rendered == "3"
    assert all(int(n) >= 3 for n in seen), seen
