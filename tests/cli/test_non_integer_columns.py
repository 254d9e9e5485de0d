"""``journal verify`` and ``journal replay`` over a SQLite journal entry whose ``seq`` (or
``source_seq``, ``emitted_at_ms``) was stored past the CHECK constraints as something other than
an integer: each reports it (verify an ``integer`` break, replay ``chain_broken``) naming the
column, never the value, goes on with the other runs and exits 1, no traceback.

Defect: both ended with a raw ``ValueError`` traceback. SQLite only: on PostgreSQL these columns
are ``BIGINT`` and cannot hold anything else.
"""

from __future__ import annotations

import pytest

from tests.cli.conftest import owned_runs_with_a_damaged_fact

SECRET = "SECRET-7"


@pytest.fixture(params=["seq", "source_seq", "emitted_at_ms"])
def damaged_url(request, tmp_path) -> tuple[str, str]:
    """Runs r1 and r2, each claimed and owned (facts ``claimed`` seq 0, ``activated`` seq 1); r1's
    ``activated`` fact holds text in one integer column."""
    url = owned_runs_with_a_damaged_fact(tmp_path, f"{request.param} = '{SECRET}'", ignore_checks=True)
    return url, request.param


def _clean(result) -> None:
    assert "Traceback" not in result.err + result.out and "ValueError" not in result.err + result.out, result
    assert SECRET not in result.err + result.out, result


def test_journal_verify_reports_the_column_and_exits_1(run_cli, damaged_url):
    url, column = damaged_url
    result = run_cli("--db", url, "journal", "verify")
    assert result.code == 1, result
    _clean(result)
    assert "1 break(s)" in result.out + result.err, result
    assert "integer" in result.out + result.err and column in result.out + result.err, result
    assert "run r1" in result.out + result.err, result


@pytest.mark.parametrize("args", [("--all",), ("--all", "--format", "json"), ("r1",)])
def test_journal_replay_reports_chain_broken_and_replays_the_other_run(run_cli, damaged_url, args):
    url, column = damaged_url
    result = run_cli("--db", url, "journal", "replay", *args)
    assert result.code == 1, result
    _clean(result)
    assert "chain_broken" in result.out, result
    if args == ("--all",):
        assert "2 run(s) replayed" in result.out, result
        assert "1 of 2 run(s) break the ownership rules" in result.err, result
        assert "r1" in result.out and "seq -1" not in result.out, result
    else:  # the others carry each violation's detail
        assert column in result.out and "not an integer" in result.out, result
    assert run_cli("--db", url, "journal", "replay", "r2").code == 0


def test_journal_replay_table_line_of_an_unreadable_fact_has_no_empty_parentheses(run_cli, damaged_url):
    """The table's violation line names the fact's event type in parentheses; a fact that could not
    be read has none, and the line read ``violation chain_broken at position 3 (): ...``. The empty
    parentheses are left out."""
    url, _column = damaged_url
    result = run_cli("--db", url, "journal", "replay", "r1")
    assert result.code == 1, result
    line = next(x for x in result.out.splitlines() if x.startswith("violation chain_broken"))
    assert "()" not in line, line
    assert line.startswith("violation chain_broken at "), line
