"""A verification kept between calls (the console's journal page) checks only what was appended since.

Defect: the console's journal page verified the whole journal whenever its head had moved, which on
a store being written is every load: about 70,000 entries a second on SQLite, so 1.4 s a load at
100,000 entries and 14 s at a million. ``Resumable.report()`` goes on from the last entry it
checked, when that entry still stands where it was with its hash, and checks the whole journal again
otherwise or when asked (``from_start``). Its reports equal ``verify``'s; its cost is counted as the
entries a pass checks.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

import fencepost
from fencepost.journal import NewEntry, verify
from fencepost.journal.verify import Resumable, _Checker
from tests.journal.test_hash_chain import _drop_triggers


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The positions of the entries each pass checks, in order (every pass of the test appends)."""
    seen: list[int] = []
    check = _Checker.check

    def counted(self, row) -> None:
        seen.append(int(row.position))
        check(self, row)

    monkeypatch.setattr(_Checker, "check", counted)
    return seen


def _append(store: fencepost.Store, n: int, tag: str) -> None:
    for i in range(n):
        store.journal.append_unfenced(f"run-{i % 3}", "step", {"tag": tag, "i": i}, source_id=f"w-{tag}")


def test_each_report_checks_only_the_new_entries_and_equals_verify(store: fencepost.Store, checked) -> None:
    kept = Resumable(store)
    empty = kept.report()
    assert empty == verify(store) and empty.entries_checked == 0 and kept.checked_from_start_at is not None
    _append(store, 20, "a")
    checked.clear()
    first = kept.report()
    assert checked == list(range(1, 21))  # nothing was checked before: all of them
    total = 20
    for round_ in range(3):
        _append(store, 5, f"r{round_}")
        total += 5
        checked.clear()
        report = kept.report()
        assert checked == list(range(total - 4, total + 1)), round_
        checked.clear()
        assert report == verify(store) and report.entries_checked == total and report.ok
    assert first.entries_checked == 20 and first.head is not None and first.head.position == 20


def test_nothing_new_checks_nothing(store: fencepost.Store, checked) -> None:
    _append(store, 6, "a")
    kept = Resumable(store)
    kept.report()
    checked.clear()
    again = kept.report()
    assert checked == [] and again == verify(store)


def test_from_start_checks_everything_again_and_sees_an_older_entry_edited(store: fencepost.Store, raw,
                                                                             checked) -> None:
    _append(store, 9, "a")
    kept = Resumable(store)
    assert kept.report().ok
    whole_at = kept.checked_from_start_at
    _drop_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET payload_json = :p WHERE position = 4"), {"p": '{"x":1}'})
    raw.commit()
    _append(store, 2, "b")
    checked.clear()
    resumed = kept.report()
    # Going on from the last checked entry, an older entry edited without its hash is not seen ...
    assert checked == [10, 11] and resumed.ok and kept.checked_from_start_at == whole_at
    checked.clear()
    whole = kept.report(from_start=True)
    # ... a whole pass sees it, as verify does.
    assert checked == list(range(1, 12)) and not whole.ok and whole == verify(store)
    assert whole.first_break is not None and (whole.first_break.position, whole.first_break.what) == (4, "content")
    assert kept.checked_from_start_at is not None and whole_at is not None and kept.checked_from_start_at > whole_at


def test_a_rewritten_last_entry_starts_over(store: fencepost.Store, raw, checked) -> None:
    _append(store, 9, "a")
    kept = Resumable(store)
    kept.report()
    _drop_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET entry_hash = :h WHERE position = 9"), {"h": "0" * 64})
    raw.commit()
    checked.clear()
    report = kept.report()
    assert checked == list(range(1, 10))
    assert report == verify(store) and not report.ok


def test_a_journal_rolled_back_past_the_last_entry_starts_over(store: fencepost.Store, raw, checked) -> None:
    _append(store, 9, "a")
    kept = Resumable(store)
    kept.report()
    _drop_triggers(store, raw)
    raw.execute(text("DELETE FROM flows_journal_events WHERE position >= 8"))
    raw.commit()
    checked.clear()
    report = kept.report()
    assert checked == list(range(1, 8))
    assert report == verify(store) and report.ok and report.entries_checked == 7
    # New entries after the rollback go on from there.
    store.journal.append_many_unfenced("run-x", [NewEntry("step", {"k": k}) for k in range(2)], source_id="z")
    checked.clear()
    later = kept.report()
    assert checked == [8, 9] and later == verify(store) and later.entries_checked == 9


def test_new_streams_and_a_broken_link_to_an_earlier_entry_are_seen(store: fencepost.Store, raw,
                                                                     checked) -> None:
    """Going on, each stream's earlier end is read from the journal (nothing per stream is kept
    between reports): a new entry whose stream link does not match it is a break, as for verify."""
    _append(store, 9, "a")
    kept = Resumable(store)
    kept.report()
    assert kept._checker is not None and kept._checker.streams == {}
    store.journal.append_unfenced("run-new", "step", {"k": 1}, source_id="n")
    store.journal.append_unfenced("run-1", "step", {"k": 2}, source_id="n")
    _drop_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET stream_prev_hash = :h WHERE position = 11"), {"h": "1" * 64})
    raw.commit()
    checked.clear()
    report = kept.report()
    assert checked == [10, 11]
    checked.clear()
    assert report == verify(store) and report.streams_checked == 4 and not report.ok
    assert [(b.position, b.what) for b in report.first_breaks] == [(11, "stream_link"), (11, "entry_hash")]
