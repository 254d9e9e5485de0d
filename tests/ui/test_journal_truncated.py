"""The journal page says so when entries it checked before are gone.

Defect (found by an audit review, both backends): the console's journal page showed head 9, then
the entries after position 7 were deleted by hand; on the next load it said "hash chain verified:
7 entries ... every link intact", its head gone backwards without a word, although the console
held the head it had checked (the anchor that proves such a removal). Now the page reports the
break at that position, on every later load, in words a reader of the page understands.
"""

from __future__ import annotations

import httpx
from sqlalchemy import text

import fencepost
from fencepost.ui import create_app
from fencepost.ui.server import UiServer

from .test_hostile_journal import _drop_append_only_triggers, _text


def test_entries_removed_after_the_console_checked_them_are_reported_on_every_load(db_url):
    with fencepost.open(db_url) as store:
        for i in range(9):
            store.journal.append_unfenced(f"run-{i % 3}", "step", {"i": i}, source_id="w")
    with UiServer(create_app(db_url, tick=0.2, poll_interval=1.0)) as server, httpx.Client(timeout=30) as client:
        first = _text(client.get(server.url + "/journal").text)
        assert "every link intact" in first and "position 9" in first
        with fencepost.open(db_url) as store:
            conn = store.db.connect()
            try:
                _drop_append_only_triggers(store, conn)
                conn.execute(text("DELETE FROM flows_journal_events WHERE position >= 8"))
                conn.commit()
            finally:
                conn.close()
        for _ in range(2):
            page = _text(client.get(server.url + "/journal").text)
            assert "hash chain broken" in page and "every link intact" not in page, page
            assert "the entry at position 9, which this console found intact earlier, is missing" in page


def test_a_break_in_a_runs_companion_stream_names_the_run_as_journal_verify_does(db_url):
    """The page named only the companion stream's hashed name where ``journal verify`` names the run."""
    from .test_hostile_journal import _edit, _owned_run

    facts = _owned_run(db_url, "order-17")
    _edit(db_url, facts[1].position, "REPLACE(payload_json, '\"pid\"', '\"pid\" ')")
    with UiServer(create_app(db_url, tick=0.2, poll_interval=1.0)) as server, httpx.Client(timeout=30) as client:
        page = _text(client.get(server.url + "/journal").text)
    assert f"first break: run order-17 (its companion stream) seq 1 (position {facts[1].position})" in page, page
