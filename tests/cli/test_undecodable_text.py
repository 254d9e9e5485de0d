"""CLI commands over a SQLite store holding TEXT that is not valid UTF-8 (a run's state, a journal
entry's payload, written by hand): each exits 1 with one line naming the column, no traceback and
never the stored bytes; ``journal verify`` reports the entry as an ``encoding`` break.

SQLite only: PostgreSQL refuses invalid UTF-8 on input in a UTF8 database; a SQL_ASCII database (which
would take any bytes) cannot hold a store at all today (opening it fails: psycopg returns its text
as bytes).
"""

from __future__ import annotations

import pytest

import fencepost
from tests.cli.conftest import assert_one_line_error, owned_runs_with_a_damaged_fact


@pytest.fixture
def spoiled_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'flows.db'}"
    with fencepost.open(url) as store:
        store.runs.create("r1", '{"flowName": "f"}')
        store.journal.append_unfenced("r1", "step", {"i": 1}, source_id="w")
        conn = store.db.connect()
        try:
            # {"flowName": "fl\xffw"} and {"i":"\xff"}: valid JSON to SQLite, invalid UTF-8.
            conn.exec_driver_sql("UPDATE flows_runs SET state_json = "
                                 "CAST(x'7b22666c6f774e616d65223a2022666cff77227d' AS TEXT)")
            conn.exec_driver_sql("DROP TRIGGER flows_journal_events_no_update_v1")
            conn.exec_driver_sql("UPDATE flows_journal_events SET payload_json = CAST(x'7b2269223a22ff227d' AS TEXT)")
            conn.commit()
        finally:
            conn.close()
    return url


@pytest.mark.parametrize("args, column", [
    (("runs", "list"), "state_json"),
    (("runs", "show", "r1"), "state_json"),
    (("journal", "show", "r1"), "payload_json"),
])
def test_reads_exit_1_with_one_line_naming_the_column(run_cli, spoiled_url, args, column):
    result = run_cli("--db", spoiled_url, *args)
    assert_one_line_error(result)
    assert result.code == 1, result
    assert "decode_failed" in result.err and column in result.err and "UTF-8" in result.err, result
    assert "\ufffd" not in result.err + result.out and "\\xff" not in result.err + result.out


@pytest.fixture
def spoiled_fact_url(tmp_path) -> str:
    """Runs r1 and r2, each claimed and owned (facts ``claimed`` seq 0, ``activated`` seq 1); r1's
    ``activated`` fact holds a payload that is not valid UTF-8."""
    return owned_runs_with_a_damaged_fact(tmp_path, "payload_json = CAST(x'7b2269223a22ff227d' AS TEXT)")


@pytest.mark.parametrize("args", [("r1",), ("--all",), ("r1", "--format", "json"), ("--all", "--format", "json")])
def test_journal_replay_reports_the_undecodable_fact_naming_the_column(run_cli, spoiled_fact_url, args):
    """Replay reports the fact as ``chain_broken`` naming the column (exit 1, like any broken
    history), instead of ending with ``decode_failed`` naming no run or entry."""
    result = run_cli("--db", spoiled_fact_url, "journal", "replay", *args)
    assert result.code == 1, result
    assert "Traceback" not in result.err + result.out
    assert "decode_failed" not in result.err + result.out, result
    assert "chain_broken" in result.out, result
    if args != ("--all",):  # the --all table counts violations by rule; the others carry each one's detail
        assert "payload_json" in result.out, result
    assert "\ufffd" not in result.err + result.out and "\\xff" not in result.err + result.out
    assert "\\ufffd" not in result.out  # nor as a JSON escape


def test_journal_replay_all_still_replays_the_intact_run(run_cli, spoiled_fact_url):
    result = run_cli("--db", spoiled_fact_url, "journal", "replay", "--all")
    assert "2 run(s) replayed" in result.out, result
    assert "1 of 2 run(s) break the ownership rules" in result.err, result


def test_journal_verify_reports_an_encoding_break(run_cli, spoiled_url):
    result = run_cli("--db", spoiled_url, "journal", "verify")
    assert result.code == 1, result
    assert "Traceback" not in result.err
    assert "encoding" in result.out + result.err and "payload_json" in result.out + result.err
