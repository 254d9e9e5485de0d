"""The console over a journal edited by hand: a run's page and the journal page still render.

* An ownership fact whose ``owner`` is not an owner (a payload edited to ``{"owner": "str", ...}``)
  made the run's page a 500 with a traceback in the log on every request; it renders, with the
  verdict ``journal replay`` gives (``chain_broken``, ``malformed_fact``), and logs nothing.
* One journal entry the journal cannot decode made ``/journal`` and its run's page a 500
  ``decode_failed``; both render, the entry shown in its place by seq and position only (what
  cannot be decoded, never what it holds), the others as usual, as ``fencepost journal show`` does.
  Text that is not UTF-8 can be stored on SQLite only (PostgreSQL refuses it on input); a payload
  that is valid JSON to the database but not to the journal (a number out of range, ``1e400``)
  can be stored on both, and takes the same path through the pages.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from sqlalchemy import text

import fencepost
from fencepost.journal import companion_stream, ownership_history
from fencepost.ui import create_app
from fencepost.ui.server import UiServer

from .conftest import PENDING, TESTER, unescape


def _drop_append_only_triggers(store: fencepost.Store, conn: Any) -> None:
    on = " ON flows_journal_events" if store.db.name == "postgresql" else ""
    for name in ("flows_journal_events_no_update_v1", "flows_journal_events_no_delete_v1"):
        conn.execute(text(f"DROP TRIGGER {name}{on}"))


def _owned_run(url: str, run_id: str) -> list[Any]:
    """``run_id`` claimed and activated (two ownership facts) beside another run; its facts."""
    with fencepost.open(url) as store:
        store.runs.create("bystander", "{}")
        store.runs.create(run_id, "{}")
        store.runs.claim_and_own(run_id, PENDING, TESTER, store.clock.now_ms())
        facts = store.journal.entries(companion_stream(run_id)).entries
    assert [e.event_type for e in facts] == ["flows.consensus.claimed", "flows.consensus.activated"]
    return facts


def _edit(url: str, position: int, sql_value: str, params: dict[str, Any] | None = None) -> None:
    with fencepost.open(url) as store:
        conn = store.db.connect()
        try:
            _drop_append_only_triggers(store, conn)
            conn.execute(text(f"UPDATE flows_journal_events SET payload_json = {sql_value} WHERE position = :p"),
                         {"p": position, **(params or {})})
            conn.commit()
        finally:
            conn.close()


def _text(body: str) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", body)))


def test_a_fact_with_a_malformed_owner_renders_the_verdict_and_logs_nothing(db_url, capfd):
    facts = _owned_run(db_url, "tampered")
    activated = facts[1]
    _edit(db_url, activated.position, ":v",
          {"v": '{"owner":"str","grantedAtMs":1,"runId":"tampered"}'})
    with fencepost.open(db_url, readonly=True) as store:  # what ``journal replay`` says of it
        verdict = ownership_history(store, "tampered").violations
    assert {"chain_broken", "malformed_fact"} <= {v.rule for v in verdict}
    with UiServer(create_app(db_url, tick=0.2, poll_interval=1.0)) as server, httpx.Client(timeout=30) as client:
        capfd.readouterr()
        for path in ("/runs/tampered", "/runs/tampered?fragment=1", "/runs/tampered"):
            r = client.get(server.url + path)
            assert r.status_code == 200, (path, r.status_code, r.text[-500:])
            shown = _text(r.text)
            assert f"replay: {len(verdict)} violation(s)" in shown, shown[:2000]
            for v in verdict:
                assert f"{v.rule} at seq {v.seq} ({v.event_type})" in shown, v
            # The facts still drawn: the intact claim on its owner's lane, the edited one in the history.
            assert 'class="fact fact-claimed"' in r.text
            assert re.search(r"activated\s*</td>\s*<td>\s*<span class=\"badge status-running\"", r.text), path
        err = capfd.readouterr().err
    assert "Traceback" not in err and "AttributeError" not in err, err
    assert len([line for line in err.splitlines() if line.strip()]) <= 1, err


def _undecodable_pages(url: str, run_id: str, bad: Any, intact: Any) -> None:
    with UiServer(create_app(url, tick=0.2, poll_interval=1.0)) as server, httpx.Client(timeout=30) as client:
        for path in (f"/runs/{run_id}", f"/runs/{run_id}?fragment=1"):
            r = client.get(server.url + path)
            assert r.status_code == 200, (path, r.status_code, r.text[-500:])
            shown = _text(r.text)
            assert f"the entry at position {bad.position} cannot be decoded" in shown, shown[-3000:]
            assert "replay:" in shown and "chain_broken" in shown
            assert "claimed" in shown  # the intact fact, as usual
            assert "\ufffd" not in r.text and "1e400" not in r.text
        r = client.get(server.url + "/journal")
        assert r.status_code == 200, (r.status_code, r.text[-500:])
        shown = _text(r.text)
        assert "hash chain broken" in shown
        row = re.search(rf"<tr class=\"undecodable\">\s*<td>{bad.seq}</td>\s*<td>{bad.position}</td>(.*?)</tr>",
                        r.text, re.S)
        assert row is not None and "cannot be decoded" in row.group(1), shown[-3000:]
        assert re.search(rf"<td>{intact.seq}</td>\s*<td>{intact.position}</td>", r.text)  # the others as usual
        assert "\ufffd" not in r.text and "1e400" not in r.text


def test_an_entry_the_journal_cannot_decode_is_shown_by_position_on_both_pages(db_url):
    facts = _owned_run(db_url, "undecodable")
    claimed, activated = facts
    # Valid JSON to the database's own check (both backends), a number out of the journal's range.
    _edit(db_url, activated.position, ":v", {"v": '{"owner":{"hostId":"h","pid":1,"nonce":"n"},"x":1e400}'})
    _undecodable_pages(db_url, "undecodable", activated, claimed)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_an_entry_holding_text_that_is_not_utf8_is_shown_by_position_on_both_pages(db_url):
    facts = _owned_run(db_url, "not-utf8")
    claimed, activated = facts
    _edit(db_url, activated.position, "CAST(x'7b226f776e6572223a22ff227d' AS TEXT)")
    _undecodable_pages(db_url, "not-utf8", activated, claimed)
