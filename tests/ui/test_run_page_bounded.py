"""A run's page stays bounded however many ownership facts the run has.

A run claimed and abandoned 10,000 times (20,000 facts) had a 5.5 MB page (and as much for each
refresh of its content): a status-history row and a timeline marker per fact. The page now reads
and draws the newest ``FACTS_SHOWN`` facts, says how many there are and where to see them all,
and still judges the run on all of them: replay's verdict covers every fact, an old one edited by
hand included.
"""

from __future__ import annotations

import re

import httpx
from sqlalchemy import text

import fencepost
from fencepost import Claimed, OwnerId
from fencepost.journal import companion_stream
from fencepost.ui import create_app, views
from fencepost.ui.server import UiServer

from .conftest import PENDING, TESTER, unescape


def _churn(store: fencepost.Store, run_id: str, cycles: int) -> None:
    """``cycles`` claims, each abandoned (two facts each), by three owners in turn; then owned."""
    store.runs.create(run_id, "{}")
    for i in range(cycles):
        me = OwnerId("churn-host", 4242, f"nonce-churn-{i % 3}")
        claimed = store.runs.claim(run_id, store.runs.get(run_id).snapshot(), me, store.clock.now_ms())
        assert isinstance(claimed, Claimed), claimed
        store.runs.abandon_claim(run_id, me, claimed.claimed_at_ms)
    store.runs.claim_and_own(run_id, PENDING, TESTER, store.clock.now_ms())


def _rows(body: str, table_class: str) -> int:
    m = re.search(rf'<table class="{table_class}"[^>]*>.*?<tbody>(.*?)</tbody>', body, re.S)
    assert m is not None, table_class
    return m.group(1).count("<tr")


def _shown(body: str) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", body)))


def test_a_run_with_more_facts_than_the_page_shows_is_bounded_and_says_so(db_url):
    cap = views.FACTS_SHOWN
    assert 500 <= cap <= 1000
    cycles = cap // 2 + 10
    total = 2 * cycles + 2  # each cycle claimed + released; then claimed + activated
    with fencepost.open(db_url) as store:
        _churn(store, "churn", cycles)
        store.runs.create("few", "{}")
        store.runs.claim_and_own("few", PENDING, TESTER, store.clock.now_ms())
        first = store.journal.entries(companion_stream("churn"), limit=1).entries[0]
    with UiServer(create_app(db_url, tick=0.2, poll_interval=1.0)) as server, httpx.Client(timeout=60) as client:
        for path in ("/runs/churn", "/runs/churn?fragment=1"):
            r = client.get(server.url + path)
            assert r.status_code == 200, (path, r.status_code)
            shown = _shown(r.text)
            # The status history: creation, the facts shown, nothing more.
            assert _rows(r.text, "history") <= cap + 3, _rows(r.text, "history")
            assert len(re.findall(r'class="fact fact-', r.text)) <= cap
            assert len(re.findall(r'<rect class="tenure', r.text)) <= cap
            assert f"showing the newest {cap} of {total} ownership facts" in shown, shown[:3000]
            assert "fencepost journal show churn --companion" in shown
            # The verdict is replay's, over every fact.
            assert "replay: consistent" in shown and f"{total} fact(s)" in shown
        few = client.get(server.url + "/runs/few")
        assert few.status_code == 200 and "showing the newest" not in _shown(few.text)

        # An old fact, one the page does not show, edited by hand: the verdict still says so.
        with fencepost.open(db_url) as store:
            conn = store.db.connect()
            on = " ON flows_journal_events" if store.db.name == "postgresql" else ""
            conn.execute(text(f"DROP TRIGGER flows_journal_events_no_update_v1{on}"))
            # The same JSON spelled otherwise: only the hash chain can tell.
            conn.execute(text("UPDATE flows_journal_events SET payload_json = REPLACE(payload_json, ':', ': ') "
                              "WHERE position = :p"), {"p": first.position})
            conn.commit()
            conn.close()
        r = client.get(server.url + "/runs/churn?fragment=1")
        assert r.status_code == 200
        shown = _shown(r.text)
        assert "replay: 1 violation(s)" in shown and f"chain_broken at seq {first.seq}" in shown, shown[:3000]
        assert _rows(r.text, "history") <= cap + 3
