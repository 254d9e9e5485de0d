"""Tampered journal rows of shapes the auditor's reads did not expect: each is reported where it
is (run, seq, position), the other entries and runs still replay, and no raw Python error escapes.

* a payload or meta nested deeper than the decoder can follow (``RecursionError``);
* a ``run_id`` stored as a BLOB (SQLite);
* a companion stream name holding a byte that is not UTF-8 (SQLite);
* an entry whose ``seq`` was edited to -1 (past the CHECK), or to another value in range.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

import fencepost
from fencepost.errors import JournalError
from fencepost.journal import companion_stream, ownership_history, replay_all, replay_each, verify
from fencepost.journal.verify import decoded, stream_page
from tests.cli.conftest import run_cli_in_process  # noqa: F401  (a fixture)
from tests.journal.conftest import A
from tests.journal.test_replay import fact

DEEP = '{"x":' + "[" * 1200 + "]" * 1200 + "}"


def _history(store: fencepost.Store) -> None:
    """Runs ``run`` (positions 1..3, seq 0..2) and ``other`` (positions 4..6), three facts each."""
    for run in ("run", "other"):
        fact(store, run, "claimed", A, 0, 0)
        fact(store, run, "activated", A, 0, 5)
        fact(store, run, "released", A, None, 9_000)


def _tamper(store: fencepost.Store, raw, statement: str, *, checks: bool = False) -> None:
    """Run ``statement`` with the append-only triggers dropped (and, ``checks``, the CHECKs off)."""
    pg = store.db.name == "postgresql"
    raw.execute(text("DROP TRIGGER flows_journal_events_no_update_v1" + (" ON flows_journal_events" if pg else "")))
    if checks:
        raw.execute(text("ALTER TABLE flows_journal_events DROP CONSTRAINT flows_journal_events_seq_check" if pg
                         else "PRAGMA ignore_check_constraints = ON"))
    raw.execute(text(statement))
    raw.commit()


def _where(run: str, seq: int) -> str:
    return f"run_id = '{companion_stream(run)}' AND seq = {seq}"


# ------------------------------------------------------------------ deep nesting


@pytest.mark.parametrize("column", ["payload_json", "meta_json"])
def test_a_deeply_nested_fact_is_malformed_and_the_rest_replays(store, raw, column):
    """A fact whose payload (or meta) nests deeper than the decoder's recursion bound raised a bare
    ``RecursionError`` out of replay, replay_all, entries and log. It is now that fact's
    ``malformed_fact`` (naming the depth limit, at its seq), the other facts and runs replay, and
    the reads are ``decode_failed`` naming the position."""
    _history(store)
    _tamper(store, raw, f"UPDATE flows_journal_events SET {column} = '{DEEP}' WHERE {_where('run', 1)}")
    history = ownership_history(store, "run")
    assert "malformed_fact" in [v.rule for v in history.violations], history
    assert {v.position for v in history.violations} == {2}
    summary = replay_all(store)
    assert summary.runs == 2 and not summary.ok
    assert [h.run_id for h in summary.histories if h.ok] == ["other"]
    totals = replay_each(store)
    assert totals.runs == 2 and [h.run_id for h in totals.broken] == ["run"]
    with pytest.raises(JournalError) as err:
        store.journal.entries(companion_stream("run"))
    assert err.value.code == "decode_failed" and "position 2" in err.value.detail
    with pytest.raises(JournalError) as err:
        list(store.journal.log())
    assert err.value.code == "decode_failed"
    shown = [decoded(row, "entries") for row in stream_page(store, companion_stream("run"), -1, 10)]
    assert [detail is None for _, detail in shown] == [True, False, True]
    assert "depth" in shown[1][1]
    assert not verify(store).ok


def test_a_deeply_nested_fact_in_the_cli(store, raw, db_url, run_cli_in_process):  # noqa: F811
    """``journal replay --all``, ``replay RUN`` and ``show RUN --companion`` printed only
    ``Error: RecursionError``; now they report the entry and exit 1."""
    _history(store)
    _tamper(store, raw, f"UPDATE flows_journal_events SET payload_json = '{DEEP}' WHERE {_where('run', 1)}")
    for args in (("replay", "--all"), ("replay", "run"), ("show", "run", "--companion"), ("verify",)):
        result = run_cli_in_process("--db", db_url, "journal", *args)
        assert result.code == 1, (args, result.out, result.err)
        assert "RecursionError" not in result.out + result.err and "Traceback" not in result.err, args
    result = run_cli_in_process("--db", db_url, "journal", "replay", "--all")
    assert "2 run(s) replayed" in result.out, result.out
    result = run_cli_in_process("--db", db_url, "journal", "show", "run", "--companion")
    assert "position 2" in result.err and "decode_failed" in result.err, result.err


# ------------------------------------------------------------------ a run_id stored as a BLOB


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_run_id_stored_as_a_blob_is_a_break_by_position(store, raw):
    """SQLite only: a TEXT column takes a BLOB as it is (PostgreSQL converts or refuses it). verify
    raised ``TypeError`` (``startswith``); it is now an ``encoding`` break at that position."""
    _history(store)
    raw.execute(text("INSERT INTO flows_journal_events SELECT CAST(run_id AS BLOB), seq + 1, event_id, source_id, "
                     "source_seq + 1, emitted_at_ms, event_type, payload_json, meta_json, content_hash, 7, "
                     "entry_hash, entry_hash, entry_hash FROM flows_journal_events WHERE position = 6"))
    raw.commit()
    report = verify(store)
    assert not report.ok and report.entries_checked == 7
    assert [(b.position, b.what) for b in report.first_breaks] == [(7, "encoding")], report
    assert "run_id" in report.first_breaks[0].detail
    assert ownership_history(store, "run").ok
    summary = replay_all(store)
    assert summary.runs >= 2 and [h.run_id for h in summary.histories if h.run_id == "run"] == ["run"]


# ------------------------------------------------------------------ a stream name that is not UTF-8


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_companion_stream_name_not_utf8_does_not_stop_replay_all(store, raw, run_cli_in_process,  # noqa: F811
                                                                    db_url):
    """SQLite only: PostgreSQL refuses invalid UTF-8 on input. Listing the companion streams
    failed as a whole (``decode_failed``), so no run was replayed. The other runs now replay, and
    the stream is reported as one whose facts name no run (no run id can hash to it)."""
    _history(store)
    raw.execute(text("INSERT INTO flows_journal_events SELECT CAST(run_id || x'ff' AS TEXT), 0, event_id, "
                     "source_id, source_seq, emitted_at_ms, event_type, payload_json, meta_json, content_hash, 7, "
                     "stream_prev_hash, log_prev_hash, entry_hash FROM flows_journal_events WHERE position = 6"))
    raw.commit()
    summary = replay_all(store)
    assert summary.runs == 2 and [h.run_id for h in summary.histories if h.ok] == ["run"]
    # ``other``'s last fact is no longer followed by the log's next entry (the inserted one).
    assert summary.violations == {"chain_broken": 1}
    assert not summary.ok and len(summary.unattributed_streams) == 1
    assert "\ufffd" in summary.unattributed_streams[0]
    totals = replay_each(store)
    assert totals.runs == 2 and len(totals.unattributed_streams) == 1
    for fmt in ((), ("--json",), ("--format", "csv")):
        result = run_cli_in_process("--db", db_url, "journal", "replay", "--all", *fmt)
        assert result.code == 1 and "decode_failed" not in result.err, (fmt, result.out, result.err)
        assert "other" in result.out or "2 run(s)" in result.out, (fmt, result.out)


# ------------------------------------------------------------------ edited seq


def test_a_seq_edited_to_minus_one_is_shown_and_blamed_in_its_place(store, raw, db_url,
                                                                    run_cli_in_process):  # noqa: F811
    """A fact whose seq was set to -1 (past the CHECK) vanished from ``journal show`` (reads began
    at seq > -1), and replay and verify blamed the next, untouched entry. It is now shown (as an
    entry that cannot be decoded, exit 1), replay's ``chain_broken`` is at its position, and verify
    names it alone."""
    _history(store)
    _tamper(store, raw, f"UPDATE flows_journal_events SET seq = -1 WHERE {_where('run', 1)}", checks=True)
    rows = stream_page(store, companion_stream("run"), -1, 10)
    assert sorted(int(r.position) for r in rows) == [1, 2, 3]
    result = run_cli_in_process("--db", db_url, "journal", "show", "run", "--companion", "--format", "csv")
    assert result.code == 1 and "position 2" in result.err, (result.out, result.err)
    history = ownership_history(store, "run")
    assert {v.position for v in history.violations if v.rule == "chain_broken"} == {2}, history
    assert 3 not in {v.position for v in history.violations}
    report = verify(store)
    assert {b.position for b in report.first_breaks} == {2}, report.first_breaks
    assert replay_all(store).runs == 2


def test_a_seq_edited_in_range_blames_that_entry_alone(store, raw):
    """Editing one entry's seq (1 -> 7) left a second ``seq`` break at the next, untouched entry
    (expected 8, found 2), although its stream link is intact: one tampered place is one entry."""
    _history(store)
    _tamper(store, raw, f"UPDATE flows_journal_events SET seq = 7 WHERE {_where('run', 1)}")
    report = verify(store)
    assert {b.position for b in report.first_breaks} == {2}, report.first_breaks
    history = ownership_history(store, "run")
    assert {v.position for v in history.violations if v.rule == "chain_broken"} == {2}, history


def test_a_deleted_or_repeated_seq_is_still_one_break(store, raw):
    """Going on from what is stored stays right for a removed entry: one break where the gap is."""
    _history(store)
    raw.execute(text("DROP TRIGGER flows_journal_events_no_delete_v1"
                     + (" ON flows_journal_events" if store.db.name == "postgresql" else "")))
    raw.execute(text("DELETE FROM flows_journal_events WHERE position = 4"))  # other's seq 0
    raw.commit()
    report = verify(store)
    assert {(b.position, b.what) for b in report.first_breaks} == {(5, "position"), (5, "log_link"),
                                                                    (5, "seq"), (5, "stream_link")}, report
