"""A journal entry whose integer column (``seq``, ``source_seq``, ``emitted_at_ms``) holds
something else, stored by hand past the CHECK constraints (``PRAGMA
ignore_check_constraints=ON``): ``verify`` reports it as an ``integer`` break naming the column,
replay as ``chain_broken`` naming the column, never the value, and both go on with the rest.

Defect: ``verify``, ``ownership_history`` and ``replay_all`` crashed with a raw ``ValueError``
(``int()`` of the stored value), so one damaged entry hid every other run's history.

SQLite only: on PostgreSQL these columns are ``BIGINT``, so a value that is not an integer cannot
be stored at all (no constraint to bypass). ``position`` is not among them: it is the table's
integer primary key on SQLite too, which refuses anything else whatever the pragma says.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost.errors import JournalError
from fencepost.journal import companion_stream, ownership_history, replay_all, verify
from tests.journal.conftest import A
from tests.journal.test_replay import fact

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])

SECRET = "SECRET-7"
DAMAGES = [("seq", f"'{SECRET}'"), ("source_seq", f"'{SECRET}'"), ("emitted_at_ms", f"'{SECRET}'"),
           ("seq", "1.5"), ("emitted_at_ms", "x'00'")]
IDS = [f"{column}-{value[:2].strip(chr(39))}" for column, value in DAMAGES]


@pytest.fixture(params=DAMAGES, ids=IDS)
def damaged(request, store: fencepost.Store, raw) -> tuple[fencepost.Store, str]:
    """Runs ``run`` and ``other`` with three ownership facts each; ``run``'s second fact (seq 1,
    ``activated``) holds a value that is not an integer in one integer column."""
    column, value = request.param
    for run in ("run", "other"):
        fact(store, run, "claimed", A, 0, 0)
        fact(store, run, "activated", A, 0, 5)
        fact(store, run, "released", A, None, 9_000)
    raw.exec_driver_sql("PRAGMA ignore_check_constraints=ON")
    raw.exec_driver_sql("DROP TRIGGER flows_journal_events_no_update_v1")
    raw.exec_driver_sql(f"UPDATE flows_journal_events SET {column} = {value} "
                        f"WHERE run_id = '{companion_stream('run')}' AND seq = 1")
    raw.commit()
    return store, column


def _clean(text: str) -> None:
    assert SECRET not in text and "1.5" not in text


def test_verify_reports_the_column_as_an_integer_break_and_checks_the_rest(damaged):
    store, column = damaged
    report = verify(store)
    assert not report.ok and report.entries_checked == 6 and report.streams_checked == 2
    found = [b for b in report.first_breaks if b.what == "integer"]
    assert len(found) == 1, report
    brk = found[0]
    assert brk.stream == companion_stream("run") and brk.run_id == "run"
    assert column in brk.detail and "not an integer" in brk.detail, brk
    assert type(brk.seq) is int and type(brk.position) is int
    for b in report.first_breaks:
        _clean(f"{b.stream} {b.seq} {b.position} {b.detail}")
    assert report.breaks == 1, report  # checked from what it stores on: nothing else breaks
    assert report.head is not None


def test_replay_reports_the_damaged_fact_as_chain_broken_naming_the_column(damaged):
    store, column = damaged
    history = ownership_history(store, "run")
    assert [v.rule for v in history.violations] == ["chain_broken"], history
    violation = history.violations[0]
    assert column in violation.detail and "not an integer" in violation.detail, violation
    _clean(f"{violation.seq} {violation.position} {violation.event_type} {violation.detail}")
    assert history.facts == 2  # the damaged fact is reported, not judged
    assert ownership_history(store, "other").ok

    summary = replay_all(store)
    assert (summary.runs, summary.violations, summary.unattributed_streams) == (2, {"chain_broken": 1}, [])
    assert [h.ok for h in summary.histories] == [True, False]  # other, run


def test_one_entry_per_page_reads_past_the_damaged_entry(damaged, monkeypatch):
    """Pages end on the damaged entry too: the next page starts after it as stored (a seq that is
    not an integer sorts after every integer on SQLite), not at ``int()`` of it."""
    import sys

    store, _column = damaged
    monkeypatch.setattr(sys.modules["fencepost.journal.verify"], "PAGE", 1)
    report = verify(store)
    assert (report.entries_checked, report.breaks) == (6, 1), report
    history = ownership_history(store, "run")
    assert ([v.rule for v in history.violations], history.facts) == (["chain_broken"], 2), history


def test_the_ownership_projection_leaves_the_damaged_fact_out_as_replay_does(damaged, make_db_url):
    """The consensus feed applied ``int()`` to the stored ``emitted_at_ms``: a damaged one stopped
    every ``OwnershipHistory`` build with a raw ``ValueError`` (or, for a real, projected a time
    the journal never stored). Replay reports such a fact and applies nothing; the projection now
    leaves it out the same way and builds the other runs' intervals."""
    from sqlalchemy import text

    from fencepost.projections import OwnershipHistory, ProjectionBuilder

    store, column = damaged
    with ProjectionBuilder(store, make_db_url(), OwnershipHistory()) as builder:
        builder.catch_up()
        rows = builder.target.read(lambda conn: conn.execute(text(
            "SELECT run_id, opened_by, activated_position IS NOT NULL, closed_by, activated_at_ms "
            "FROM projection_ownership_history ORDER BY run_id, opened_position")).all())
    other = [tuple(r) for r in rows if r[0] == "other"]
    assert [r[:4] for r in other] == [("other", "claimed", 1, "released")], rows
    assert all(type(r[4]) is int for r in rows if r[4] is not None), rows
    if column == "emitted_at_ms":  # the activation is left out: the claim stays a claim
        assert [tuple(r[:4]) for r in rows if r[0] == "run"] == [("run", "claimed", 0, "released")], rows


def test_entries_and_log_say_the_column_does_not_hold_an_integer(damaged):
    """``journal.entries()`` and ``journal.log()`` refused the damaged entry as "outside the safe
    integer range", which reads as a number too large: now the error says the column does not hold
    an integer, naming the column and the entry's position, never the value."""
    store, column = damaged
    for read in (lambda: store.journal.entries(companion_stream("run")), lambda: list(store.journal.log())):
        with pytest.raises(JournalError) as caught:
            read()
        text = str(caught.value)
        assert caught.value.code == "decode_failed"
        assert f"stored {column} does not hold an integer" in text and "safe integer range" not in text, text
        assert "position" in text
        _clean(text)
