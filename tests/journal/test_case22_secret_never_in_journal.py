"""Fault suite case 22 (REFERENCE 5): a secret carried by run state, an attempt outcome and journal
payloads is stored verbatim only in ``flows_runs.state_json`` and ``flows_attempts.outcome_json``."""

from __future__ import annotations

import json

from sqlalchemy import Text, cast, column, inspect, select, table

import fencepost
from fencepost.runstore.rows import Attempt
from tests.journal.conftest import A

SECRET = "sk-live-4f9a1c7e2b8d6f3a0e5c"


def _every_text_cell(store: fencepost.Store) -> dict[tuple[str, str], list[str]]:
    """Every column of every table in the store's database, each cell as text."""

    def scan(conn) -> dict[tuple[str, str], list[str]]:
        insp = inspect(conn)
        found: dict[tuple[str, str], list[str]] = {}
        for name in insp.get_table_names():
            cols = [c["name"] for c in insp.get_columns(name)]
            stmt = select(*[cast(column(c), Text) for c in cols]).select_from(table(name))
            for row in conn.execute(stmt):
                for c, value in zip(cols, row, strict=True):
                    if value is not None:
                        found.setdefault((name, c), []).append(value)
        return found

    return store.db.read(scan)


def test_secret_is_only_in_run_state_and_attempt_outcome(store: fencepost.Store, clock) -> None:
    """Case 22 (a) and (b): the child run logs the secret, returns it inside a string and carries it in
    an ``apiKey`` field. Journal rows hold neither the secret, and do hold ``"apiKey":"[REDACTED]"``
    and ``token=[REDACTED]``; scanning every column of every table finds the secret in exactly
    ``flows_runs.state_json`` and ``flows_attempts.outcome_json``, and in both."""
    run_id = "child-run"
    store.runs.create(run_id, json.dumps({"input": {"apiKey": SECRET}, "prompt": f"use {SECRET}"}))
    store.runs.claim_and_own(run_id, store.runs.get(run_id), A, clock.now_ms())
    started = Attempt(run_id, "step-digest-1", 1, "running", started_at_ms=clock.now_ms(),
                      meta={"tool": "http"})
    assert type(store.attempts.put(started, A)).__name__ == "Inserted"
    j = store.journal
    j.append(run_id, "log", {"line": f"calling the API with token={SECRET}"}, owner=A, source_id="engine")
    j.append(run_id, "tool.result", {"text": f"the service answered: {SECRET} (echo)"}, owner=A, source_id="engine")
    j.append(run_id, "tool.call", {"apiKey": SECRET, "url": "https://api.example/v1"}, owner=A, source_id="engine",
             meta={"note": f"Authorization: Bearer {SECRET}"})
    clock.advance(500)
    finished = Attempt(run_id, "step-digest-1", 1, "succeeded", started_at_ms=started.started_at_ms,
                       finished_at_ms=clock.now_ms(), outcome={"value": f"result carries {SECRET}"},
                       meta={"tool": "http"})
    assert type(store.attempts.finish(finished, A)).__name__ == "Finished"
    store.runs.transition_owned(run_id, A, "completed", state_json=json.dumps({"result": f"done with {SECRET}"}))

    cells = _every_text_cell(store)
    journal_text = "\n".join(cells[("flows_journal_events", "payload_json")]
                             + cells[("flows_journal_events", "meta_json")])
    assert SECRET not in journal_text
    assert '"apiKey":"[REDACTED]"' in journal_text
    assert "token=[REDACTED]" in journal_text
    holders = {where for where, values in cells.items() if any(SECRET in v for v in values)}
    assert holders == {("flows_runs", "state_json"), ("flows_attempts", "outcome_json")}


def test_secret_in_journal_identifiers_is_refused_and_never_stored(store: fencepost.Store, clock) -> None:
    """Case 22 extended to identifiers: the secret passed as an event type, a producer id or a stream
    id (which would also land in the derived ``event_id``) is refused, and a scan of every column of
    every table finds it only in ``flows_runs.state_json``."""
    import pytest

    from fencepost.errors import JournalError

    run_id = "child-run"
    store.runs.create(run_id, json.dumps({"input": {"apiKey": SECRET}}))
    store.runs.claim_and_own(run_id, store.runs.get(run_id), A, clock.now_ms())
    j = store.journal
    attempts = [
        lambda: j.append(run_id, f"tool.{SECRET}", {}, owner=A, source_id="engine"),
        lambda: j.append(run_id, "log", {}, owner=A, source_id=f"engine/{SECRET}"),
        lambda: j.append_unfenced(SECRET, "log", {}, source_id="engine"),
        lambda: j.append_unfenced(f"token={SECRET}", "log", {}, source_id="engine"),
    ]
    for attempt in attempts:
        with pytest.raises(JournalError) as info:
            attempt()
        assert info.value.code == "invalid_event"
        assert SECRET not in str(info.value)
    j.append(run_id, "log", {"line": "ok"}, owner=A, source_id="engine")
    cells = _every_text_cell(store)
    holders = {where for where, values in cells.items() if any(SECRET in v for v in values)}
    assert holders == {("flows_runs", "state_json")}
    assert ("flows_journal_events", "event_id") in cells
