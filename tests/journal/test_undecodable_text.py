"""A journal entry holding TEXT that is not valid UTF-8 (written by hand after the append-only
triggers were dropped, or by a foreign tool): reads fail as ``decode_failed`` naming the column,
``verify`` reports the entry as an ``encoding`` break and checks the rest.

SQLite only: SQLite stores whatever bytes a statement casts to TEXT; PostgreSQL refuses invalid
UTF-8 on input in a UTF8 database; a SQL_ASCII database (which would take any bytes) cannot hold a
store at all today (opening it fails: psycopg returns its text as bytes).
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost.journal import verify

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])

# ``{"i":"\xff"}``: valid JSON to SQLite (it does not check UTF-8), invalid UTF-8.
BAD_PAYLOAD = "CAST(x'7b2269223a22ff227d' AS TEXT)"


@pytest.fixture
def spoiled(store: fencepost.Store, raw) -> fencepost.Store:
    """Positions 1..9 over streams run-0..run-2; position 5 (run-1, seq 1) holds invalid UTF-8."""
    for i in range(9):
        store.journal.append_unfenced(f"run-{i % 3}", "step", {"i": i}, source_id="w")
    raw.exec_driver_sql("DROP TRIGGER flows_journal_events_no_update_v1")
    raw.exec_driver_sql(f"UPDATE flows_journal_events SET payload_json = {BAD_PAYLOAD} WHERE position = 5")
    raw.commit()
    return store


def _clean(message: str) -> None:
    assert "\\xff" not in message and "\ufffd" not in message


def test_entries_and_log_are_decode_failed_naming_the_column(spoiled):
    with pytest.raises(fencepost.JournalError) as err:
        spoiled.journal.entries("run-1")
    assert err.value.code == "decode_failed"
    assert "payload_json" in str(err.value) and "UTF-8" in str(err.value)
    _clean(str(err.value))
    with pytest.raises(fencepost.JournalError) as err:
        list(spoiled.journal.log())
    assert err.value.code == "decode_failed" and "payload_json" in str(err.value)
    # The other streams are still readable.
    assert [e.seq for e in spoiled.journal.entries("run-0").entries] == [0, 1, 2]


def test_verify_reports_an_encoding_break_and_checks_the_rest(spoiled):
    report = verify(spoiled)
    assert not report.ok
    assert report.entries_checked == 9
    assert report.breaks == 1
    brk = report.first_break
    assert brk is not None
    assert (brk.position, brk.stream, brk.seq, brk.what) == (5, "run-1", 1, "encoding")
    assert "payload_json" in brk.detail and "UTF-8" in brk.detail
    _clean(brk.detail)
    assert report.head is not None and report.head.position == 9


def test_verify_names_every_undecodable_column(store, raw):
    store.journal.append_unfenced("run-0", "step", {"i": 0}, source_id="w")
    raw.exec_driver_sql("DROP TRIGGER flows_journal_events_no_update_v1")
    raw.exec_driver_sql(f"UPDATE flows_journal_events SET payload_json = {BAD_PAYLOAD}, "
                        "event_type = CAST(x'73ff' AS TEXT)")
    raw.commit()
    brk = verify(store).first_break
    assert brk is not None and brk.what == "encoding"
    assert "event_type" in brk.detail and "payload_json" in brk.detail


@pytest.fixture
def spoiled_fact(store: fencepost.Store, raw) -> fencepost.Store:
    """Runs ``run`` and ``other`` with three ownership facts each; ``run``'s second fact (seq 1)
    holds a payload that is not valid UTF-8."""
    from fencepost.journal import companion_stream
    from tests.journal.conftest import A
    from tests.journal.test_replay import fact

    for run in ("run", "other"):
        fact(store, run, "claimed", A, 0, 0)
        fact(store, run, "activated", A, 0, 5)
        fact(store, run, "released", A, None, 9_000)
    raw.exec_driver_sql("DROP TRIGGER flows_journal_events_no_update_v1")
    raw.exec_driver_sql(f"UPDATE flows_journal_events SET payload_json = {BAD_PAYLOAD} "
                        f"WHERE run_id = '{companion_stream('run')}' AND seq = 1")
    raw.commit()
    return store


def test_replay_reports_an_undecodable_fact_as_chain_broken_naming_the_column(spoiled_fact):
    """Defect: replay read the facts through ``entries``, so one fact holding text that is not UTF-8
    ended the replay with ``decode_failed`` naming no run and no entry (``replay --all`` judged no
    run at all), while ``verify`` reports the same entry as a break and goes on. Replay now reports
    it as ``chain_broken`` at its seq, naming the column (never the bytes), judges the other facts,
    and replays the other runs."""
    from fencepost.journal import ownership_history, replay_all

    history = ownership_history(spoiled_fact, "run")
    assert [(v.rule, v.seq) for v in history.violations] == [("chain_broken", 1)], history
    detail = history.violations[0].detail
    assert "payload_json" in detail and "UTF-8" in detail, detail
    _clean(detail + history.violations[0].event_type)
    assert history.facts == 2  # the undecodable fact is reported, not judged
    assert ownership_history(spoiled_fact, "other").ok
    summary = replay_all(spoiled_fact)
    assert (summary.runs, summary.violations, summary.unattributed_streams) == (2, {"chain_broken": 1}, [])
    assert [h.ok for h in summary.histories] == [True, False]  # other, run


def test_a_resumed_verification_over_an_unreadable_stream_end_checks_everything(store, raw):
    """The console's verification goes on from its last entry by reading each stream's end; a
    stream whose end holds a hash that is not UTF-8 cannot be read so: it checks the whole journal
    instead, and reports what ``verify`` does."""
    from fencepost.journal.verify import Resumable

    for i in range(9):
        store.journal.append_unfenced(f"run-{i % 3}", "step", {"i": i}, source_id="w")
    kept = Resumable()
    assert kept.report(store).ok
    raw.exec_driver_sql("DROP TRIGGER flows_journal_events_no_update_v1")
    raw.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
    # run-2's last entry (position 9, the mark itself) keeps its hash; run-1's (position 8) does not.
    raw.exec_driver_sql("UPDATE flows_journal_events SET entry_hash = CAST(x'ff' AS TEXT) WHERE position = 8")
    raw.commit()
    # An entry after it in run-1 (its head cannot be read, so not through the journal's append).
    raw.exec_driver_sql(
        "INSERT INTO flows_journal_events (run_id, seq, event_id, source_id, source_seq, emitted_at_ms, event_type,"
        " payload_json, meta_json, content_hash, position, stream_prev_hash, log_prev_hash, entry_hash)"
        " SELECT run_id, seq + 1, event_id || 'x', source_id, source_seq + 10, emitted_at_ms, event_type,"
        " payload_json, meta_json, content_hash, 10, stream_prev_hash, log_prev_hash, entry_hash"
        " FROM flows_journal_events WHERE position = 8")
    raw.commit()
    whole_before = kept.checked_from_start_at
    report = kept.report(store)
    assert report == verify(store) and not report.ok
    assert kept.checked_from_start_at is not None and whole_before is not None
    assert kept.checked_from_start_at > whole_before
