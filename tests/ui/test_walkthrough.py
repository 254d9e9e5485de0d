"""What a new user met walking through the console, on both backends: a credential in a flow name,
and a database that goes away while the console is open."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from html import unescape
from typing import Any

import httpx
import pytest
from sqlalchemy import text

import fencepost
from fencepost.ui import create_app
from fencepost.ui.server import UiServer

from .conftest import EventStream
from .test_browser import _until, browser  # noqa: F401  (the browser fixture)

SECRET = "hunter2-never-shown"


def error_code(r: httpx.Response) -> str:
    m = re.search(r'<code id="error-code">([^<]*)</code>', r.text)
    assert m, r.text[:500]
    return m.group(1)


@contextmanager
def database_gone(store: fencepost.Store) -> Iterator[None]:
    """The store's tables out of reach of every connection (a dropped or renamed PostgreSQL schema, a
    SQLite file whose tables were renamed away), then put back."""
    if store.db.name == "postgresql":
        schema = store.db.schema
        moves = [(f"ALTER SCHEMA {schema} RENAME TO {schema}_gone", f"ALTER SCHEMA {schema}_gone RENAME TO {schema}")]
    else:
        tables = store.db.read(lambda c: [r[0] for r in c.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")])
        moves = [(f'ALTER TABLE "{t}" RENAME TO "gone_{t}"', f'ALTER TABLE "gone_{t}" RENAME TO "{t}"') for t in tables]

    def run(statements: list[str]) -> None:
        conn = store.db.connect()
        try:
            for s in statements:
                conn.execute(text(s))
            conn.commit()
        finally:
            conn.close()

    run([away for away, _ in moves])
    try:
        yield
    finally:
        run([back for _, back in moves])


def test_a_credential_in_the_flow_name_is_redacted_in_the_listing_and_the_stream(db_url: str) -> None:
    """The flow name is the run state's ``flowName``: the run page showed it redacted, but the runs
    listing and the live ``run`` event showed it as stored, ``password=...`` included."""
    with fencepost.open(db_url) as store:
        store.runs.create("before", f'{{"flowName": "sync password={SECRET}"}}')
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.5)) as console:
            stream = EventStream(console.url)
            try:
                store.runs.create("live", f'{{"flowName": "sync password={SECRET}", "n": 1}}')
                _, event, _ = stream.wait(lambda n, d: n == "run" and d["run_id"] == "live", 10)
            finally:
                stream.close()
            listing = httpx.get(console.url + "/", timeout=10).text
            run_page = httpx.get(console.url + "/runs/before", timeout=10).text
            plain = httpx.get(console.url + "/", params={"flow": "demo"}, timeout=10)
    assert SECRET not in json.dumps(event) and event["flow_name"] == "sync password=[REDACTED]"
    assert SECRET not in listing and unescape(listing).count("<td>sync password=[REDACTED]</td>") == 2
    assert SECRET not in run_page and "sync password=[REDACTED]" in unescape(run_page)
    assert plain.status_code == 200  # filtering by a flow name still works


def test_a_database_gone_gives_error_pages_without_tracebacks(db_url: str, capfd: pytest.CaptureFixture[str]) -> None:
    """Its tables gone while the console is open: every page is a 503 with the store's error code,
    the projections page included (it said "no projection has a checkpoint on this database"), and
    the console's stderr is not flooded with a traceback per request. Back, and the pages are back."""
    from fencepost.projections import ProjectionBuilder, RunsByStatus

    with fencepost.open(db_url) as store:
        store.runs.create("r-1", '{"flowName": "f"}')
        with ProjectionBuilder(store, store.url, RunsByStatus()) as builder:
            builder.catch_up()
        pages = ("/", "/runs/r-1", "/journal", "/projections", "/health", "/health.json")
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.5)) as console:
            capfd.readouterr()
            with database_gone(store):
                for path in pages:
                    r = httpx.get(console.url + path, timeout=10)
                    assert r.status_code == 503, (path, r.status_code, r.text[-500:])
                    code = r.json()["error"] if path.endswith(".json") else error_code(r)  # JSON answers in JSON
                    assert code and code != "internal_error", path
                    assert "no projection has a checkpoint" not in r.text
                time.sleep(3)  # the follower retries every second meanwhile
                err = capfd.readouterr().err
            for path in pages:
                assert httpx.get(console.url + path, timeout=10).status_code == 200, path
    assert "Traceback" not in err, err[-2000:]
    # One line per page, one for the follower and one for the stats, however long the outage lasts.
    assert err.count("\n") <= len(pages) + 2, err


def test_the_stream_says_when_the_database_is_unreachable_and_when_it_is_back(db_url: str) -> None:
    """While the database is out of reach the pages kept saying "live" with nothing arriving: now
    the stream sends ``unavailable`` (with the store's error code, no URL) and ``stats`` again once
    the database answers."""
    with fencepost.open(db_url) as store:
        store.runs.create("r-1", "{}")
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.5)) as console:
            stream = EventStream(console.url)
            try:
                with database_gone(store):
                    _, down, _ = stream.wait(lambda n, d: n == "unavailable", 10)
                _, up, _ = stream.wait(lambda n, d: n == "stats", 10)
            finally:
                stream.close()
    assert isinstance(down["error"], str) and down["error"] and "://" not in json.dumps(down)
    assert up["counts"]["pending"] == 1



def test_an_open_page_says_the_database_is_unavailable_then_live_again(db_url: str, browser: Any) -> None:  # noqa: F811
    """The badge of an open page said "live" all through an outage; now it says the database is
    unavailable, and "live" again once the database answers, without a reload."""
    with fencepost.open(db_url) as store:
        store.runs.create("r-1", "{}")
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.5)) as console:
            browser.get(console.url + "/")
            browser.execute_script("window.notReloaded = true;")
            badge = "return document.getElementById('live').textContent;"
            _until(browser, "the page is live", lambda d: d.execute_script(badge) == "live")
            with database_gone(store):
                _until(browser, "the page says the database is unavailable",
                       lambda d: d.execute_script(badge) == "database unavailable")
            _until(browser, "the page is live again", lambda d: d.execute_script(badge) == "live")
            assert browser.execute_script("return window.notReloaded === true;")


def test_an_open_run_page_says_when_its_run_is_deleted(db_url: str, browser: Any) -> None:  # noqa: F811
    """A run deleted while its page was open: the runs listing struck the row through, but the run's
    page kept saying "pending" (its refresh got a 404 and ignored it). Now its badge says "deleted"
    and a note says that what is shown is the run's last state; a run created again under the same
    id brings the page back."""
    with fencepost.open(db_url) as store:
        store.runs.create("doomed", '{"flowName": "d"}')
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.5)) as console:
            browser.get(console.url + "/runs/doomed")
            browser.execute_script("window.notReloaded = true;")
            _until(browser, "the page is live", lambda d: d.execute_script(
                "return document.getElementById('live').textContent === 'live';"))
            store.runs.delete("doomed")
            status = "return document.getElementById('run-status').textContent;"
            _until(browser, "the badge says deleted", lambda d: d.execute_script(status) == "deleted")
            note = browser.execute_script("const n = document.getElementById('run-gone'); return n && n.textContent;")
            assert note and "deleted" in note
            store.runs.create("doomed", '{"flowName": "again"}')
            _until(browser, "the run is back", lambda d: d.execute_script(status) == "pending"
                   and d.execute_script("return document.getElementById('run-gone') === null;"))
            assert browser.execute_script("return window.notReloaded === true;")


@pytest.mark.parametrize("given", ["9999999999999999", "0001-01-01", "1969-12-31T23:59"])
def test_a_created_bound_out_of_range_names_the_query_parameter(db_url: str, given: str) -> None:
    """A created bound the store cannot take (past 2**53 - 1 ms, or before 1970) was refused naming
    ``created_after_ms``, a field the page's user never typed; it names ``created_after`` now."""
    fencepost.open(db_url).close()
    with UiServer(create_app(db_url)) as console:
        for name in ("created_after", "created_before"):
            r = httpx.get(console.url + "/", params={name: given}, timeout=10)
            assert r.status_code == 400 and error_code(r) == "invalid_options", (name, r.status_code)
            detail = unescape(re.search(r'</code>: ([^<]*)</p>', r.text).group(1))
            assert detail.startswith(f"{name} ") and f"{name}_ms" not in detail, detail
            assert given not in detail


def test_pages_catch_up_with_what_changed_while_the_console_was_down(db_url: str, browser: Any) -> None:  # noqa: F811
    """The console restarted (Ctrl-C, then ``fencepost ui`` again) while pages were open: they
    reconnected and said "live", but what changed meanwhile never reached them (a run shown pending
    that was running, a new run missing) until a manual reload. A page that reconnects to a feed
    that moved now catches up: the runs page reloads itself, a run page refreshes."""
    from .conftest import PENDING, TESTER

    with fencepost.open(db_url) as store:
        store.runs.create("gap-1", "{}")
        first = UiServer(create_app(db_url, tick=0.2, poll_interval=0.5)).start()
        port = int(first.url.rsplit(":", 1)[1])
        try:
            browser.get(first.url + "/")
            runs_tab = browser.current_window_handle
            browser.switch_to.new_window("tab")
            browser.get(first.url + "/runs/gap-1")
            run_tab = browser.current_window_handle
            live = "return document.getElementById('live').textContent === 'live';"
            for tab in (runs_tab, run_tab):
                browser.switch_to.window(tab)
                _until(browser, "the page is live", lambda d: d.execute_script(live))
        finally:
            first.stop()
        store.runs.claim_and_own("gap-1", PENDING, TESTER, store.clock.now_ms())
        store.runs.create("gap-2", "{}")
        with UiServer(create_app(db_url, tick=0.2, poll_interval=0.5), port=port):
            browser.switch_to.window(runs_tab)
            _until(browser, "the runs page shows what changed", lambda d: d.execute_script(
                "const ids = {}; for (const tr of document.querySelectorAll('#runs tr[data-run-id]'))"
                "  ids[tr.dataset.runId] = tr.querySelector('.status').textContent.trim();"
                "return ids['gap-1'] === 'running' && ids['gap-2'] === 'pending';"))
            browser.switch_to.window(run_tab)
            _until(browser, "the run page shows what changed", lambda d: d.execute_script(
                "return document.getElementById('run-status').textContent === 'running';"))


def test_the_hub_says_unavailable_soon_after_its_follower_fails(db_url: str) -> None:
    """Pages learned of an outage only when the statistics were next due (every five seconds, the
    follower's failure did not count), so the badge went on saying "live" for up to five seconds
    after the database was gone (and a browser test waiting five seconds failed about one run in
    three). A failing follower now has the statistics taken again at the next tick."""
    from fencepost.ui import views
    from fencepost.ui.hub import FeedHub

    with fencepost.open(db_url) as store:
        store.runs.create("r-1", "{}")
        reader = fencepost.open(db_url, readonly=True)
        hub = FeedHub(reader, stats=lambda h: views.stats(reader, h), poll_interval=0.2, tick=0.05,
                      stats_every=60.0)
        seen: list[str] = []
        hub.publish = lambda event, *args, **kw: seen.append(event)  # type: ignore[method-assign]

        def until(what: str, within: float) -> None:
            deadline = time.monotonic() + within
            while what not in seen:
                assert time.monotonic() < deadline, f"no {what} event within {within} s: {seen}"
                time.sleep(0.02)

        hub.start()
        try:
            until("stats", 5.0)  # the first statistics, before the outage
            with database_gone(store):
                until("unavailable", 10.0)  # well before the statistics are next due (60 s)
        finally:
            hub.close()
            reader.close()


@pytest.mark.parametrize("name", ["created_after", "created_before", "limit"])
def test_a_digit_of_another_script_is_a_bad_parameter_not_a_server_error(db_url: str, name: str) -> None:
    """``str.isdigit`` admits "²" and other scripts' digits, which ``int`` refuses: such a created
    bound or limit ended in a ValueError inside the page (a 500). It is now the ``400
    invalid_options`` any other malformed value gets."""
    fencepost.open(db_url).close()
    with UiServer(create_app(db_url)) as console:
        for given in ("²", "1²", "٣"):
            r = httpx.get(console.url + "/", params={name: given}, timeout=10)
            assert r.status_code == 400 and error_code(r) == "invalid_options", (given, r.status_code)


def test_a_created_bound_with_a_utc_offset_is_read_as_runs_list_reads_it(db_url: str) -> None:
    """``created_after=2026-01-31T14:00:00+02:00`` is an ISO date/time (``runs list --created-after``
    takes it, honouring the offset); the page refused it as "must be milliseconds or an ISO
    date/time". It lists what the CLI lists: the offset honoured, a time without one read as UTC."""
    from datetime import UTC, datetime, timedelta, timezone

    with fencepost.open(db_url) as store:
        store.runs.create("early", '{"flowName": "tz"}')
        created = store.runs.get("early").created_at_ms
    at = datetime.fromtimestamp(created / 1000, UTC)
    plus_two = at.astimezone(timezone(timedelta(hours=2))).replace(microsecond=0)
    just_after = (plus_two + timedelta(seconds=1)).isoformat()
    just_before = (plus_two - timedelta(seconds=1)).isoformat()
    with UiServer(create_app(db_url)) as console:
        def listed(**params: str) -> bool:
            r = httpx.get(console.url + "/", params=params, timeout=10)
            assert r.status_code == 200, (params, r.status_code, r.text[:600])
            return 'data-run-id="early"' in r.text

        assert listed(created_after=just_before) and not listed(created_after=just_after)
        assert listed(created_before=just_after) and not listed(created_before=just_before)
        assert listed(created_after=just_before.replace("+02:00", "+0200"))
        # Typed into the address bar, the "+" arrives as a space: still the offset.
        r = httpx.get(console.url + "/?created_after=" + just_after, timeout=10)  # a raw "+"
        assert r.status_code == 200 and 'data-run-id="early"' not in r.text, r.status_code
        # Without an offset the same wall time is UTC: two hours later than the +02:00 one.
        assert not listed(created_after=just_before[:19])


@pytest.mark.parametrize("change", ["one_to_several", "several_to_one", "store_dropped"])
def test_an_open_page_reloads_when_the_console_comes_back_over_other_stores(
        make_db_url: Any, browser: Any, change: str) -> None:  # noqa: F811
    """The console restarted with other stores (a second ``--db`` added, one removed) while a runs
    page was open: the page's stream position (``SOURCE:REVISION`` over one store,
    ``NAME=SOURCE:REVISION,...`` over several) or its ``down=`` store was refused by the new
    console as ``400 invalid_options``, and the page said "reconnecting" for ever. Positions of
    other stores are a ``reset``: the page reloads once and shows the stores served now."""
    from tests.conftest import SilentServer

    a, b = make_db_url(), make_db_url()
    silent = SilentServer()  # never listening: a store whose server refuses connections
    gone = f"postgresql+psycopg://u@127.0.0.1:{silent.port}/db"
    for url in (a, b):
        with fencepost.open(url) as store:
            store.runs.create("in-" + ("a" if url == a else "b"), "{}")
    before, after = {
        "one_to_several": (a, {"a": a, "b": b}),
        "several_to_one": ({"a": a, "b": b}, a),
        "store_dropped": ({"a": a, "gone": gone}, {"a": a}),
    }[change]
    try:
        first = UiServer(create_app(before, tick=0.2, poll_interval=0.5)).start()
        port = int(first.url.rsplit(":", 1)[1])
        try:
            browser.get(first.url + "/")
            _until(browser, "the page is live", lambda d: d.execute_script(
                "return document.getElementById('live').textContent.startsWith('live');"))
            browser.execute_script("window.notReloaded = true;")
        finally:
            first.stop()
        with UiServer(create_app(after, tick=0.2, poll_interval=0.5), port=port):
            _until(browser, "the page reloads and is live over the stores served now", lambda d: d.execute_script(
                "return window.notReloaded === undefined"
                "  && document.getElementById('live').textContent === 'live';"))
            several = isinstance(after, dict) and len(after) > 1
            assert browser.execute_script(
                "return document.querySelector('#runs tr[data-run-id]').dataset.store !== undefined;") == several
    finally:
        silent.close()


def test_one_named_store_replays_a_pages_position(db_url: str) -> None:
    """``create_app({"edge": url})`` (one store, named) serves the single-store console, but its
    event stream looked the page's position up under the store name "" and failed (``KeyError``):
    every page's stream died before its ``hello`` and the page said "reconnecting" for ever."""
    with fencepost.open(db_url) as store:
        store.runs.create("named-1", "{}")
        at = store.feed.position()
        store.runs.create("named-2", "{}")
    with UiServer(create_app({"edge": db_url}, tick=0.2)) as console:
        stream = EventStream(console.url, since=at)
        try:
            _, data, _ = stream.wait(lambda name, d: name == "run", 10)
            assert data["run_id"] == "named-2"
        finally:
            stream.close()


def test_one_named_store_serves_its_run_pages(db_url: str, capfd: pytest.CaptureFixture[str]) -> None:
    """``create_app({"edge": url})`` serves the single-store console at the same addresses, but a
    run's page looked the store up under the name "" : ``500 internal_error`` and a ``KeyError``
    traceback on stderr for every run page (its fragment too)."""
    with fencepost.open(db_url) as store:
        store.runs.create("named-run", "{}")
    with UiServer(create_app({"edge": db_url})) as console:
        for path in ("/runs/named-run", "/runs/named-run?fragment=1", "/runs/?id=named-run"):
            r = httpx.get(console.url + path, timeout=10)
            assert r.status_code == 200 and "named-run" in r.text, (path, r.status_code)
        r = httpx.get(console.url + "/runs/no-such-run", timeout=10)
        assert r.status_code == 404 and error_code(r) == "not_found_row"
    assert "Traceback" not in capfd.readouterr().err
