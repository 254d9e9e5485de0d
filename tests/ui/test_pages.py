"""The console's pages over HTTP, on both backends, against a store the demo filled."""

from __future__ import annotations

import http.client
import json
import re
import time
from html import unescape
from typing import Any

import httpx
import pytest

import fencepost
from fencepost.journal import head, ownership_history
from fencepost.ui import views

from .conftest import PENDING, TESTER, demo_run_ids, fact_owners, new_run, taken_over

ROW = re.compile(r'<tr data-run-id="([^"]+)"')


def get(console: Any, path: str, **params: Any) -> httpx.Response:
    return httpx.get(console.url + path, params=params or None, timeout=10)


def error_code(r: httpx.Response) -> str:
    m = re.search(r'<code id="error-code">([^<]*)</code>', r.text)
    assert m, r.text[:500]
    return m.group(1)


def listed(writer: fencepost.Store, filters: dict | None = None) -> list[str]:
    out, cursor = [], None
    while True:
        page = writer.feed.list_runs(filters, cursor, 200, newest_first=True)
        out += [r.run_id for r in page.runs]
        cursor = page.cursor
        if cursor is None:
            return out


def test_runs_page_lists_newest_first_with_status_counts(console, writer):
    r = get(console, "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    ids = [unescape(i) for i in ROW.findall(r.text)]
    assert ids == listed(writer)[:50]
    assert set(demo_run_ids(writer)) <= set(ids)
    counts = views.status_counts(writer)
    for status, n in counts.items():
        assert f'<span class="n" data-count="{status}">{n}</span>' in r.text
    assert sum(counts.values()) >= 12 and counts["completed"] > 0


def test_runs_page_filters_and_pages_with_the_library_cursor(console, writer):
    for _ in range(3):
        new_run(writer, "ui-page")
    expected = listed(writer)
    seen, query, pages = [], {"limit": "4"}, 0
    while True:
        r = get(console, "/", **query)
        assert r.status_code == 200
        seen += [unescape(i) for i in ROW.findall(r.text)]
        pages += 1
        m = re.search(r'<a id="next-page" href="/\?([^"]+)"', r.text)
        if m is None:
            break
        query = dict(httpx.QueryParams(unescape(m.group(1))))
        assert query["limit"] == "4" and query["cursor"]
    assert seen == expected and pages == -(-len(expected) // 4)

    completed = [unescape(i) for i in ROW.findall(get(console, "/", status="completed").text)]
    assert completed == listed(writer, {"status": "completed"})[:50] and completed
    demo = [unescape(i) for i in ROW.findall(get(console, "/", flow="demo", status="completed").text)]
    assert demo == listed(writer, {"flow_name": "demo", "status": "completed"})[:50]
    rows = writer.feed.list_runs(None, None, 200).runs
    lo, hi = rows[2].created_at_ms, rows[5].created_at_ms
    ranged = [unescape(i) for i in ROW.findall(get(console, "/", created_after=str(lo), created_before=str(hi)).text)]
    assert ranged == listed(writer, {"created_after_ms": lo, "created_before_ms": hi})
    assert len(ranged) >= 4


def test_bad_cursor_or_filter_is_400_with_the_library_error_code(console):
    for params, code in [
        ({"cursor": "not-a-cursor"}, "invalid_cursor"),
        ({"cursor": '{"version":2}'}, "invalid_cursor"),
        ({"status": "bogus"}, "invalid_options"),
        ({"created_after": "yesterday"}, "invalid_options"),
        ({"created_before": "2026-13-45"}, "invalid_options"),
        ({"limit": "0"}, "invalid_options"),
        ({"limit": "x"}, "invalid_options"),
        ({"limit": "201"}, "invalid_options"),
    ]:
        r = get(console, "/", **params)
        assert r.status_code == 400, params
        assert error_code(r) == code, params
    # A cursor issued for other filters does not resume this listing.
    page = get(console, "/", limit="1", status="completed")
    cursor = dict(httpx.QueryParams(unescape(re.search(r'id="next-page" href="/\?([^"]+)"', page.text).group(1))))
    r = get(console, "/", limit="1", cursor=cursor["cursor"])
    assert r.status_code == 400 and error_code(r) == "invalid_cursor"
    # A well-formed cursor of another source (a rotation, another database): start again.
    foreign = json.dumps({"version": 1, "source": "0" * 32, "createdAtMs": 1, "runId": "x",
                          "filters": [None, None, [], None, [], None, None, "newest_first"]})
    r = get(console, "/", cursor=foreign)
    assert r.status_code == 400 and error_code(r) == "source_changed"


def test_unknown_run_is_a_404_page(console):
    r = get(console, "/runs/no-such-run-anywhere")
    assert r.status_code == 404 and error_code(r) == "not_found_row"
    assert r.headers["content-type"].startswith("text/html")
    r = get(console, "/no/such/page")
    assert r.status_code == 404 and error_code(r) == "not_found"


def test_run_page_shows_a_stolen_run_with_its_timeline_and_replay_verdict(console, writer):
    rid = taken_over(writer)
    history = ownership_history(writer, rid)
    owners = fact_owners(writer, rid)
    r = get(console, f"/runs/{rid}")
    assert r.status_code == 200
    text = r.text
    svg = re.search(r'<svg[^>]*class="timeline"[^>]*data-lanes="(\d+)"', text)
    assert svg and int(svg.group(1)) == len(owners) >= 2
    assert text.count('<g class="lane"') == len(owners)
    for owner in owners:
        assert f'data-owner="{owner}"' in text
    assert 'class="fact fact-stolen"' in text and 'class="takeover"' in text and 'class="gap"' in text
    assert 'class="settlement"' in text
    assert "replay: consistent" in text and f"{history.facts} fact(s)" in text
    for what in ("created", "claimed", "activated", "stolen", "released", "settled"):
        assert f"<td>{what}</td>" in text, what
    row = writer.runs.get(rid)
    assert '"flowName": "demo"' in unescape(text) and row.status in text
    assert 'id="lineage"' in text and ('id="attempts"' in text or "no step attempts recorded" in text)


def test_run_page_redacts_state_secrets_and_escapes_html(console, writer):
    rid = f"ui-<b>esc</b>-{time.time_ns()}"
    writer.runs.create(rid, '{"flowName": "<script>alert(1)</script>", "apiKey": "sk-live-SECRET-never-shown", '
                            '"note": "password=hunter2-never-shown", "n": 1}')
    r = get(console, f"/runs/{rid}")
    assert r.status_code == 200
    assert "SECRET-never-shown" not in r.text and "hunter2-never-shown" not in r.text
    assert "[REDACTED]" in r.text
    assert "<script>alert(1)</script>" not in r.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
    assert "<b>esc</b>" not in r.text and "&lt;b&gt;esc&lt;/b&gt;" in r.text
    listing = get(console, "/").text
    assert "<b>esc</b>" not in listing and "SECRET-never-shown" not in listing


def test_run_page_shows_attempts_cancellation_and_lineage_rounds(console, writer):
    from fencepost import Attempt

    rid = new_run(writer, "ui-att")
    writer.runs.claim_and_own(rid, PENDING, TESTER, writer.clock.now_ms())
    attempt = Attempt(run_id=rid, step_key_digest="step-digest-1", attempt=0, state="running",
                      started_at_ms=writer.clock.now_ms(), checkpoint={"token": "tok-never-shown", "cursor": 7})
    writer.attempts.put(attempt, TESTER)
    writer.runs.request_cancel(rid, writer.clock.now_ms())
    text = get(console, f"/runs/{rid}").text
    assert "step-digest-1" in text and "tok-never-shown" not in text and "&#34;cursor&#34;: 7" in text
    assert "cancellation requested" in text and "no cancellation requested" not in text
    assert "ui-test-host/4242/nonce-ui" in text
    lineage = re.search(r'<table class="lineage".*?</table>', text, re.S).group(0)
    assert rid in lineage and "current" in lineage


def test_journal_page_shows_verification_head_and_latest_entries(console, writer):
    text = get(console, "/journal").text
    h = head(writer)
    assert "hash chain verified" in text
    assert f"position {h.position}, hash <code>{h.entry_hash}</code>" in text
    assert "ownership facts of demo-" in text and "flows.consensus." in text


def test_projections_page_shows_position_lag_and_rebuilds(console, writer):
    text = get(console, "/projections").text
    assert 'data-projection="runs_by_status"' in text
    status = views.projections(writer)[0]
    assert status["name"] == "runs_by_status"
    row = re.search(r'<tr data-projection="runs_by_status">.*?</tr>', text, re.S).group(0)
    assert f'data-field="applied_revision">{status["applied_revision"]}<' in row
    assert f'>{status["lag"]}</td>' in row
    assert "Rebuild history" in text and "never rebuilt" in text


def test_health_page_shows_feed_source_rates_and_oldest_heartbeat(console, writer):
    rid = new_run(writer, "ui-hb")
    now = writer.clock.now_ms()
    writer.runs.claim_and_own(rid, PENDING, TESTER, now)
    text = get(console, "/health").text
    pos = writer.feed.position()
    assert f'data-field="source">{pos.source}<' in text
    assert "run writes/s" in text and "journal appends/s" in text
    oldest = views.oldest_heartbeat(writer)
    assert oldest is not None and f"{oldest[0]}</a>" in text
    data = get(console, "/health.json").json()
    assert data["source"] == pos.source and data["revision"] >= pos.revision
    assert data["oldest_heartbeat"]["run_id"] == oldest[0]


def test_no_page_writes_and_every_write_method_is_refused(console, writer):
    store = console.app.state.store
    assert store.db.readonly
    before = (writer.feed.position(), head(writer))
    rid = demo_run_ids(writer)[0]
    for path in ("/", f"/runs/{rid}", "/journal", "/projections", "/health", "/health.json", "/static/app.js"):
        assert get(console, path).status_code == 200, path
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        r = httpx.request(method, console.url + "/", timeout=10)
        assert r.status_code == 405 and error_code(r) == "read_only"
    assert (writer.feed.position(), head(writer)) == before


def _raw(console: Any, path: str) -> tuple[int, bytes]:
    host = console.url.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=10)
    conn.putrequest("GET", path, skip_accept_encoding=True)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body


@pytest.mark.parametrize("path", [
    "/static/../../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd", "/static/..%2f..%2fpyproject.toml",
    "/static/%252e%252e/x", "/runs/../journal", "/static/./app.js", "/static/app.js%00.png",
])
def test_path_traversal_is_refused(console, path):
    status, body = _raw(console, path)
    assert status in (400, 404), (path, status)
    assert b"root:" not in body and b"[project]" not in body


def test_oversized_query_or_path_is_refused(console):
    status, body = _raw(console, "/?flow=" + "x" * 5000)
    assert status == 414 and b"query_too_long" in body
    status, body = _raw(console, "/runs/" + "x" * 11_000)  # over the longest run id, percent-encoded
    assert status == 414 and b"path_too_long" in body
    assert _raw(console, "/?flow=" + "x" * 100)[0] == 200


def test_pages_load_nothing_from_elsewhere_and_send_a_strict_csp(console, writer):
    rid = demo_run_ids(writer)[0]
    for path in ("/", f"/runs/{rid}", "/journal", "/projections", "/health"):
        r = get(console, path)
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        for ref in re.findall(r'(?:src|href)="([^"]*)"', r.text):
            assert ref.startswith("/") and not ref.startswith("//"), (path, ref)
        assert "<script>" not in r.text and " style=" not in r.text
    js = get(console, "/static/app.js")
    assert js.headers["content-type"].startswith("text/javascript")
    assert "http://" not in js.text and "https://" not in js.text and "innerHTML" not in js.text
    assert "setInterval" not in js.text and "EventSource" in js.text


def test_run_page_shows_the_failure_record_field_by_field(console, writer):
    """A run settled failed with a reason: type, message and traceback shown, credentials redacted."""
    from fencepost import RunFailure

    rid = new_run(writer, "ui-fail")
    writer.runs.claim_and_own(rid, PENDING, TESTER, writer.clock.now_ms())
    failure = RunFailure("ValueError", "bad input; password=hunter2-never-shown",
                         'Traceback (most recent call last):\n  File "task.py", line 3, in run\nValueError: bad input')
    writer.runs.transition_owned(rid, TESTER, "failed", failure=failure)
    assert writer.runs.get(rid).failure is not None
    text = get(console, f"/runs/{rid}").text
    box = re.search(r'<table class="kv failure" id="failure">.*?</table>', text, re.S)
    assert box, "no failure section"
    shown = unescape(box.group(0))
    assert "<th>type</th>" in shown and "ValueError" in shown and "bad input; password=" in shown
    assert 'File "task.py", line 3, in run' in shown
    assert "hunter2-never-shown" not in text and "[REDACTED]" in shown
    ok = get(console, f"/runs/{demo_run_ids(writer)[0]}").text
    assert 'id="failure"' not in ok  # a run without a failure record has no such section


def test_failure_view_redacts_every_text_field():
    """The view applies the journal's redaction itself too (a record written by another tool)."""
    from fencepost import RunFailure

    shown = dict(views.failure_view(RunFailure("ValueError", "password=hunter2-never-shown",
                                               'token = "Bearer abcdefghijklmnop0123"')))
    assert shown["type"] == "ValueError"
    assert "hunter2-never-shown" not in shown["message"] and "[REDACTED]" in shown["message"]
    assert "abcdefghijklmnop0123" not in shown["traceback"]
    assert views.failure_view(None) is None


def test_a_foreign_host_header_is_refused_on_loopback(console):
    """A page on another site that rebinds its name to 127.0.0.1 names its own host: refused."""
    for host in ("evil.example", "evil.example:8765", "127.0.0.1.evil.example", "[::2]:80"):
        r = httpx.get(console.url + "/health.json", headers={"host": host}, timeout=10)
        assert r.status_code == 400 and error_code(r) == "invalid_host", host
    port = console.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
        assert httpx.get(console.url + "/health.json", headers={"host": host}, timeout=10).status_code == 200, host
