"""One console over several stores: on SQLite files, on PostgreSQL schemas and on a mix of both.

Two independent stores, ``a`` and ``b``, each with runs of its own (one run id held by both), served
by one console: the runs listing is merged and labelled, a run's page is addressed by store, the
journal, projections and health pages have a section per store, and one merged follower feeds the
event stream with the writes of either store.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from html import unescape
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

import fencepost
from fencepost.clock import ManualClock
from fencepost.journal import verify
from fencepost.projections import ProjectionBuilder, RunsByStatus
from fencepost.ui import create_app, views
from fencepost.ui.server import UiServer
from tests.conftest import drop_schema, require_postgres

from .conftest import PENDING, TESTER, EventStream

ROW = re.compile(r'<tr data-run-id="([^"]+)" data-store="([^"]+)"')
NEXT = re.compile(r'<a id="next-page" href="/\?([^"]+)"')
PASSWORD = "sekret-pw-never-shown"
T0 = 1_800_000_000_000


def _url(kind: str, tmp: Any, schemas: list[str]) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp / ('s-' + uuid.uuid4().hex[:8] + '.db')}"
    base = make_url(require_postgres())
    schema = "t_" + uuid.uuid4().hex[:16]
    schemas.append(schema)
    # The server trusts local connections: the password is ignored by it, and must never be shown.
    with_password = base.set(password=PASSWORD).render_as_string(hide_password=False)
    return f"{with_password}?schema={schema}"


class Pair:
    """Two writable stores (``a``, ``b``, manual clocks) and the console served over both, read-only."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.clocks = {name: ManualClock(T0) for name in urls}
        self.writers = {name: fencepost.open(url, clock=self.clocks[name]) for name, url in urls.items()}

    def create(self, name: str, run_id: str, at: int, flow: str = "ui-several") -> str:
        clock = self.clocks[name]
        clock.advance(at - clock.now_ms())
        state = {"flowName": flow, "store": name, "apiKey": "sk-live-SECRET-never-shown"}
        self.writers[name].runs.create(run_id, json.dumps(state))
        return run_id

    def expected(self, filters: dict | None = None) -> list[tuple[str, str]]:
        """Every run of both stores, newest first, ties broken as the merged listing breaks them."""
        rows = []
        for name, store in self.writers.items():
            cursor = None
            while True:
                page = store.feed.list_runs(filters, cursor, 200, newest_first=True)
                rows += [(r.created_at_ms, r.run_id, name) for r in page.runs]
                cursor = page.cursor
                if cursor is None:
                    break
        rows.sort(reverse=True)
        return [(run_id, name) for _, run_id, name in rows]


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mix"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    schemas: list[str] = []
    tmp = tmp_path_factory.mktemp("several")
    kinds = {"sqlite": ("sqlite", "sqlite"), "postgresql": ("postgresql", "postgresql"),
             "mix": ("sqlite", "postgresql")}[request.param]
    p = Pair({"a": _url(kinds[0], tmp, schemas), "b": _url(kinds[1], tmp, schemas)})
    try:
        # Interleaved creation times, two ties across the stores, and one run id held by both.
        for i in range(5):
            p.create("a", f"a-{i}", T0 + 1000 * (2 * i))
            p.create("b", f"b-{i}", T0 + 1000 * (2 * i + 1))
        p.create("a", "tie-a", T0 + 20_000)
        p.create("b", "tie-b", T0 + 20_000)
        p.create("a", "twin", T0 + 21_000, flow="flow-of-a")
        p.create("b", "twin", T0 + 21_000, flow="flow-of-b")
        a = p.writers["a"]
        a.runs.claim_and_own("a-1", PENDING, TESTER, p.clocks["a"].now_ms())
        a.runs.transition_owned("a-1", TESTER, "completed")
        with ProjectionBuilder(a, a.url, RunsByStatus()) as builder:
            builder.catch_up()
        p.console = UiServer(create_app(p.urls, tick=0.2, poll_interval=0.5)).start()
        yield p
    finally:
        console = getattr(p, "console", None)
        if console is not None:
            console.stop()
        for store in p.writers.values():
            store.close()
        for schema in schemas:
            drop_schema(require_postgres(), schema)


def get(pair: Pair, path: str, **params: Any) -> httpx.Response:
    return httpx.get(pair.console.url + path, params=params or None, timeout=10, follow_redirects=False)


def error_code(r: httpx.Response) -> str:
    m = re.search(r'<code id="error-code">([^<]*)</code>', r.text)
    assert m, r.text[:500]
    return m.group(1)


def rows(r: httpx.Response) -> list[tuple[str, str]]:
    return [(unescape(run_id), store) for run_id, store in ROW.findall(r.text)]


def walk(pair: Pair, limit: int, **params: str) -> tuple[list[tuple[str, str]], int]:
    seen, query, pages = [], {"limit": str(limit), **params}, 0
    while True:
        r = get(pair, "/", **query)
        assert r.status_code == 200, r.text[:300]
        seen += rows(r)
        pages += 1
        m = NEXT.search(r.text)
        if m is None:
            return seen, pages
        query = dict(httpx.QueryParams(unescape(m.group(1))))
        assert pages < 100


def test_runs_page_merges_both_stores_labelled_newest_first_with_summed_counts(pair):
    r = get(pair, "/")
    assert r.status_code == 200
    listed = rows(r)
    assert listed == pair.expected()[:50]
    assert {store for _, store in listed} == {"a", "b"}
    assert ("twin", "a") in listed and ("twin", "b") in listed
    assert '<th>store</th><th>run</th>' in r.text and "merged across 2 stores (a, b)" in r.text
    assert '<a href="/runs/b/b-3">b-3</a>' in r.text
    counts = views.status_counts_across(pair.writers)
    assert counts == {s: sum(views.status_counts(w)[s] for w in pair.writers.values()) for s in views.STATUSES}
    for status, n in counts.items():
        assert f'<span class="n" data-count="{status}">{n}</span>' in r.text
    assert PASSWORD not in r.text and "SECRET" not in r.text


def test_paging_across_stores_never_skips_or_repeats(pair):
    expected = pair.expected()
    for limit in (1, 3, 4, 50):
        seen, pages = walk(pair, limit)
        assert seen == expected, limit
        assert -(-len(expected) // limit) <= pages <= -(-len(expected) // limit) + 1
    seen, _ = walk(pair, 2, status="pending")
    assert seen == pair.expected({"status": "pending"}) and ("a-1", "a") not in seen
    seen, _ = walk(pair, 2, flow="flow-of-b")
    assert seen == [("twin", "b")]
    seen, _ = walk(pair, 3, created_after=str(T0 + 3000), created_before=str(T0 + 8000))
    assert seen == pair.expected({"created_after_ms": T0 + 3000, "created_before_ms": T0 + 8000})
    assert len(seen) == 6


def test_a_run_page_per_store_shows_that_stores_data(pair):
    for name in ("a", "b"):
        r = get(pair, f"/runs/{name}/twin")
        assert r.status_code == 200
        assert f'data-store="{name}"' in r.text and f'<span class="mono" id="run-store">{name}</span>' in r.text
        assert f"flow-of-{name}" in r.text and "SECRET" not in r.text and "[REDACTED]" in r.text
        assert f'<a href="/runs/{name}/twin">twin</a>' in r.text  # its lineage, on its store
    r = get(pair, "/runs/a/a-1")
    assert r.status_code == 200 and 'id="run-status">completed<' in r.text
    assert 'class="timeline" data-lanes="1"' in r.text and "replay: consistent" in r.text
    lanes = re.findall(r'<g class="lane"', r.text)
    assert len(lanes) == 1
    fragment = get(pair, "/runs/b/b-2", fragment="1")
    assert fragment.status_code == 200 and "<html" not in fragment.text and "b-2" in fragment.text


def test_a_run_id_alone_redirects_to_the_store_that_holds_it(pair):
    r = get(pair, "/runs/b-4")
    assert r.status_code == 307 and r.headers["location"] == "/runs/b/b-4"
    r = get(pair, "/runs/twin")
    assert r.status_code == 409 and error_code(r) == "ambiguous_run"


def test_unknown_store_or_run_is_a_404_page(pair):
    for path, code in (("/runs/c/a-1", "unknown_store"), ("/runs/a/b-1", "not_found_row"),
                       ("/runs/no-such-run", "not_found_row"), ("/runs/b/no-such-run", "not_found_row")):
        r = get(pair, path)
        assert r.status_code == 404, path
        assert error_code(r) == code, path
        assert r.headers["content-type"].startswith("text/html")


def test_bad_cursor_or_filter_is_400_with_the_library_error_code(pair):
    page = get(pair, "/", limit="2")
    cursor = dict(httpx.QueryParams(unescape(NEXT.search(page.text).group(1))))["cursor"]
    body = json.loads(cursor)
    assert set(body["stores"]) == {"a", "b"}
    other_stores = json.dumps({"version": 1, "stores": {"a": None, "c": None}})
    one_store = pair.writers["a"].feed.list_runs(None, None, 1, newest_first=True).cursor
    swapped = json.dumps({"version": 1, "stores": {"a": body["stores"]["b"], "b": body["stores"]["a"]}})
    for params, code in [
        ({"cursor": other_stores}, "invalid_cursor"),  # a cursor of other stores
        ({"cursor": one_store}, "invalid_cursor"),  # a cursor of one store's own listing
        ({"cursor": "not-a-cursor"}, "invalid_cursor"),
        ({"cursor": cursor, "status": "completed"}, "invalid_cursor"),  # issued for other filters
        ({"cursor": swapped}, "source_changed"),  # each store's position given to the other store
        ({"status": "bogus"}, "invalid_options"),
        ({"created_after": "yesterday"}, "invalid_options"),
        ({"limit": "201"}, "invalid_options"),
        ({"limit": "0"}, "invalid_options"),
    ]:
        r = get(pair, "/", **params)
        assert r.status_code == 400, params
        assert error_code(r) == code, params


def test_journal_page_verifies_each_store(pair):
    r = get(pair, "/journal")
    assert r.status_code == 200
    split = r.text.index('<section class="store" data-store="b">')
    sections = {"a": r.text[r.text.index('<section class="store" data-store="a">'):split], "b": r.text[split:]}
    for name, store in pair.writers.items():
        report = verify(store)
        assert report.ok
        assert f'id="verify-{name}"' in sections[name]
        assert f"{report.entries_checked} entries in {report.streams_checked} streams" in sections[name]
    assert "ownership facts of a-1" in sections["a"] and "ownership facts of" not in sections["b"]


def test_projections_page_has_a_section_per_store(pair):
    r = get(pair, "/projections")
    assert r.status_code == 200
    a = r.text[r.text.index('data-store="a"'):r.text.index('data-store="b"')]
    b = r.text[r.text.index('data-store="b"'):]
    assert 'id="projections-a"' in a and 'data-projection="runs_by_status"' in a
    assert "no projection has a checkpoint on this database" in b


def test_health_page_and_json_have_one_entry_per_store_and_no_password(pair):
    r = get(pair, "/health")
    assert r.status_code == 200
    for name, store in pair.writers.items():
        assert f'<section class="store" data-store="{name}" data-run-base="/runs/{name}/">' in r.text
        assert store.feed.position().source in r.text
    doc = get(pair, "/health.json").json()
    assert set(doc["stores"]) == {"a", "b"}
    for name, store in pair.writers.items():
        h = doc["stores"][name]
        assert h["source"] == store.feed.position().source and h["backend"] == store.db.backend.name
        assert h["follower"]["position"] is not None
    for path in ("/", "/health", "/health.json", "/journal", "/projections", "/runs/a/a-1", "/runs/b/b-1"):
        assert PASSWORD not in get(pair, path).text, path


def test_a_write_to_either_store_is_on_the_stream_within_one_second(pair):
    hub = pair.console.app.state.hub
    stream = EventStream(pair.console.url)
    try:
        for name in ("a", "b", "b", "a"):
            rid = f"sse-{name}-{uuid.uuid4().hex[:8]}"
            pair.writers[name].runs.create(rid, '{"flowName": "ui-several"}')
            written = time.monotonic()
            _, data, arrived = stream.wait(
                lambda n, d, rid=rid: n == "run" and d["run_id"] == rid, timeout=1.0)
            assert arrived - written < 1.0
            assert data["store"] == name and data["status"] == "pending"
            pair.writers[name].runs.claim_and_own(rid, PENDING, TESTER, pair.clocks[name].now_ms())
            written = time.monotonic()
            _, data, arrived = stream.wait(
                lambda n, d, rid=rid: n == "run" and d["run_id"] == rid and d["status"] == "running", timeout=1.0)
            assert arrived - written < 1.0 and data["store"] == name
        _, stats, _ = stream.wait(lambda n, d: n == "stats", timeout=3.0)
        assert set(stats["stores"]) == {"a", "b"} and sum(stats["counts"].values()) > 0
        assert stats["stores"]["a"]["projections"][0]["name"] == "runs_by_status"
    finally:
        stream.close()
    # One follower per store (a thread each, each retrying on its own when its store stops
    # answering), shared by every page.
    assert hub.followers_started == len(pair.writers)
    followers = [t.name for t in threading.enumerate() if t.name in ("fencepost-follow-a", "fencepost-follow-b")]
    assert sorted(followers) == ["fencepost-follow-a", "fencepost-follow-b"]


def test_a_page_over_several_stores_gets_what_changed_after_it_was_rendered(pair):
    """Over several stores too, a page's stream started at the follower's positions, not the ones
    the page was rendered at: a run created or started in between never reached the page. The page
    now carries each store's position and its stream replays the changes after them first."""
    r = get(pair, "/")
    at = json.loads(unescape(re.search(r'data-position="([^"]+)"', r.text).group(1)))["stores"]
    assert set(at) == {"a", "b"}
    rendered = ",".join(f"{n}={p['source']}:{p['revision']}" for n, p in at.items())
    made = {"a": f"gap-a-{uuid.uuid4().hex[:8]}", "b": f"gap-b-{uuid.uuid4().hex[:8]}"}
    for name, rid in made.items():
        pair.writers[name].runs.create(rid, "{}")
    pair.writers["a"].runs.claim_and_own(made["a"], PENDING, TESTER, pair.clocks["a"].now_ms())
    hub = pair.console.app.state.hub
    deadline = time.monotonic() + 10
    while any(hub.positions[n].revision < s.feed.position().revision for n, s in pair.writers.items()):
        assert time.monotonic() < deadline  # until the follower has broadcast them: only a replay brings them now
        time.sleep(0.05)
    stream = EventStream(pair.console.url, since=rendered)
    try:
        got = {}
        while True:
            name, data, _ = stream.wait(lambda n, d: n in ("run", "hello"), 5)
            if name == "hello":
                break
            got[(data["store"], data["run_id"])] = data["status"]
        assert got == {("a", made["a"]): "running", ("b", made["b"]): "pending"}
        assert data == {"stores": {n: {"source": s.feed.position().source, "revision": s.feed.position().revision}
                                   for n, s in pair.writers.items()}}
    finally:
        stream.close()
    other = rendered.split(",")[0]  # another console's stores (only a)
    r = httpx.get(pair.console.url + "/events", params={"since": other}, timeout=5)
    assert r.text.count("event: reset") == 1 and "event: run" not in r.text


def test_several_statuses_over_several_stores(pair):
    """``?status=a&status=b`` filtered by the last only; merged across stores it lists either."""
    both = ["pending", "completed"]
    seen: list[tuple[str, str]] = []
    query = httpx.QueryParams([("status", "pending"), ("status", "completed"), ("limit", "3")])
    for _ in range(100):
        r = httpx.get(pair.console.url + "/", params=query, timeout=10)
        assert r.status_code == 200, r.text[:300]
        seen += rows(r)
        m = NEXT.search(r.text)
        if m is None:
            break
        query = httpx.QueryParams(unescape(m.group(1)))
    assert seen == pair.expected({"status": both}) and ("a-1", "a") in seen


def test_the_console_stays_read_only(pair):
    for store in pair.console.app.state.stores.values():
        assert store.db.readonly
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        r = httpx.request(method, pair.console.url + "/runs/a/a-0", timeout=10)
        assert r.status_code == 405


def test_create_app_refuses_writable_stores_and_the_same_database_twice(tmp_path):
    url = f"sqlite:///{tmp_path / 'one.db'}"
    with fencepost.open(url) as writable:
        with pytest.raises(ValueError, match="readonly"):
            create_app(stores={"a": writable, "b": writable})
    with pytest.raises(ValueError, match="same database"):
        create_app({"a": url, "b": url})
