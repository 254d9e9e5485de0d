"""Pages on a store made for the test: a broken hash chain, a rebuilt projection, an empty store."""

from __future__ import annotations

import re

import httpx
from sqlalchemy import text

import fencepost
from fencepost.journal import verify
from fencepost.projections import ProjectionBuilder, RunsByStatus
from fencepost.ui import create_app
from fencepost.ui.server import UiServer


def _drop_append_only_triggers(store: fencepost.Store, raw) -> None:
    on = " ON flows_journal_events" if store.db.name == "postgresql" else ""
    for name in ("flows_journal_events_no_update_v1", "flows_journal_events_no_delete_v1"):
        raw.execute(text(f"DROP TRIGGER {name}{on}"))
    raw.commit()


def test_journal_page_reports_the_first_break_of_an_edited_chain(store: fencepost.Store, raw) -> None:
    for i in range(6):
        store.journal.append_unfenced(f"stream-{i % 2}", "step", {"i": i}, source_id="w")
    _drop_append_only_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET payload_json = :p WHERE position = 4"), {"p": '{"i":40}'})
    raw.commit()
    report = verify(store)
    assert not report.ok and report.first_break is not None
    with UiServer(create_app(store.url)) as console:
        page = httpx.get(console.url + "/journal", timeout=10).text
    assert "hash chain broken" in page and f"{report.breaks} break(s)" in page
    b = report.first_break
    assert f"first break: stream <code>{b.stream}</code> seq {b.seq} (position {b.position}): {b.what}" in page


def test_projections_page_lists_the_rebuild_history(store: fencepost.Store) -> None:
    for i in range(5):
        store.runs.create(f"p-{i}", "{}")
    with ProjectionBuilder(store, store.url, RunsByStatus()) as builder:
        builder.catch_up()
        store.feed.rotate_source()
        assert builder.catch_up().rebuilt
        applied = builder.status().applied_revision
    with UiServer(create_app(store.url)) as console:
        page = httpx.get(console.url + "/projections", timeout=10).text
    history = re.search(r'<table class="rebuilds">.*?</table>', page, re.S)
    assert history and "<td>source_changed</td>" in history.group(0)
    assert f'data-field="applied_revision">{applied}<' in page and 'data-field="rebuilds">1<' in page


def test_every_page_renders_on_an_empty_store(store: fencepost.Store) -> None:
    with UiServer(create_app(store.url)) as console:
        for path, says in (("/", "no runs match"), ("/journal", "the journal is empty"),
                           ("/projections", "no projection has a checkpoint"), ("/health", "no running run")):
            r = httpx.get(console.url + path, timeout=10)
            assert r.status_code == 200 and says in r.text, path


def test_create_app_refuses_a_writable_store(store: fencepost.Store) -> None:
    import pytest

    with pytest.raises(ValueError, match="readonly"):
        create_app(store=store)


def test_run_page_shows_replay_violations_beside_the_timeline(store: fencepost.Store) -> None:
    """Facts that break the rules (a second owner activated without a steal): the verdict lists them."""
    from fencepost.journal import companion_stream, ownership_history
    from tests.journal.conftest import A, B

    store.runs.create("forged", "{}")

    def fact(kind: str, owner, grant: int, at_ms: int) -> None:  # as the run store appends them
        store.clock.set(at_ms)  # type: ignore[attr-defined]
        payload = {"runId": "forged", "owner": owner.to_json(), "grantedAtMs": grant}
        store.db.write(lambda conn: store.journal.append_in(
            conn, companion_stream("forged"), f"flows.consensus.{kind}", payload, source_id="flows.run-store",
            meta={"runId": "forged"}))

    fact("claimed", A, 1_000, 1_000)
    fact("activated", A, 1_000, 1_000)
    fact("claimed", B, 2_000, 2_000)
    fact("activated", B, 2_000, 2_000)
    rules = [v.rule for v in ownership_history(store, "forged").violations]
    # The row (pending, nobody's) is not what the forged facts leave: that is reported too.
    assert rules == ["claim_while_owned", "two_owners", "row_disagrees"]
    with UiServer(create_app(store.url)) as console:
        page = httpx.get(console.url + "/runs/forged", timeout=10).text
    verdict = re.search(r'<aside class="verdict bad" id="verdict">.*?</aside>', page, re.S)
    assert verdict and "replay: 3 violation(s)" in verdict.group(0)
    for rule in rules:
        assert f"<code>{rule}</code>" in verdict.group(0)
    assert page.count('<g class="violation">') == 3 and page.count('<g class="lane"') == 2
