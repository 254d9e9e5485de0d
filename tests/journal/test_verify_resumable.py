"""A verification kept between calls (the console's journal page) checks only what was appended since.

Defect: the console's journal page verified the whole journal whenever its head had moved, which on
a store being written is every load: about 70,000 entries a second on SQLite, so 1.4 s a load at
100,000 entries and 14 s at a million. ``Resumable.report()`` goes on from the last entry it
checked, when that entry still stands where it was with its hash, and checks the whole journal again
otherwise or when asked (``from_start``). Its reports equal ``verify``'s; its cost is counted as the
entries a pass checks.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import pytest
from sqlalchemy import text

import fencepost
from fencepost.journal import NewEntry, verify
from fencepost.journal.verify import Resumable, _Checker
from tests.journal.test_hash_chain import _drop_triggers


@pytest.fixture
def checked(verified_positions: list[int]) -> list[int]:
    """The positions of the entries each pass checks, in order (every pass of the test appends)."""
    return verified_positions


def _append(store: fencepost.Store, n: int, tag: str) -> None:
    for i in range(n):
        store.journal.append_unfenced(f"run-{i % 3}", "step", {"tag": tag, "i": i}, source_id=f"w-{tag}")


def test_each_report_checks_only_the_new_entries_and_equals_verify(store: fencepost.Store, checked) -> None:
    kept = Resumable()
    empty = kept.report(store)
    assert empty == verify(store) and empty.entries_checked == 0 and kept.checked_from_start_at is not None
    _append(store, 20, "a")
    checked.clear()
    first = kept.report(store)
    assert checked == list(range(1, 21))  # nothing was checked before: all of them
    total = 20
    for round_ in range(3):
        _append(store, 5, f"r{round_}")
        total += 5
        checked.clear()
        report = kept.report(store)
        assert checked == list(range(total - 4, total + 1)), round_
        checked.clear()
        assert report == verify(store) and report.entries_checked == total and report.ok
    assert first.entries_checked == 20 and first.head is not None and first.head.position == 20


def test_nothing_new_checks_nothing(store: fencepost.Store, checked) -> None:
    _append(store, 6, "a")
    kept = Resumable()
    kept.report(store)
    checked.clear()
    again = kept.report(store)
    assert checked == [] and again == verify(store)


def test_from_start_checks_everything_again_and_sees_an_older_entry_edited(store: fencepost.Store, raw,
                                                                             checked) -> None:
    _append(store, 9, "a")
    kept = Resumable()
    assert kept.report(store).ok
    whole_at = kept.checked_from_start_at
    _drop_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET payload_json = :p WHERE position = 4"), {"p": '{"x":1}'})
    raw.commit()
    _append(store, 2, "b")
    checked.clear()
    resumed = kept.report(store)
    # Going on from the last checked entry, an older entry edited without its hash is not seen ...
    assert checked == [10, 11] and resumed.ok and kept.checked_from_start_at == whole_at
    checked.clear()
    whole = kept.report(store, from_start=True)
    # ... a whole pass sees it, as verify does.
    assert checked == list(range(1, 12)) and not whole.ok and whole == verify(store)
    assert whole.first_break is not None and (whole.first_break.position, whole.first_break.what) == (4, "content")
    assert kept.checked_from_start_at is not None and whole_at is not None and kept.checked_from_start_at > whole_at


def test_a_rewritten_last_entry_starts_over(store: fencepost.Store, raw, checked) -> None:
    _append(store, 9, "a")
    kept = Resumable()
    seen = kept.report(store).head
    _drop_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET entry_hash = :h WHERE position = 9"), {"h": "0" * 64})
    raw.commit()
    checked.clear()
    report = kept.report(store)
    assert checked == list(range(1, 10))
    # The entry's own hash break, and the entry seen before stored with another hash.
    assert report == verify(store, anchor=seen) and not report.ok and report.breaks == 2


def test_a_journal_rolled_back_past_the_last_entry_starts_over_and_says_entries_went(
        store: fencepost.Store, raw, checked) -> None:
    """Defect (found by an audit review of the console, both backends): a journal whose newest
    entries were deleted after the console had checked them verified as intact on the next load
    ("every link intact", its head gone backwards without a word), although the check held the
    head it had seen: the very anchor that proves such a removal. A whole pass now checks that
    entry as ``verify`` checks an anchor, and says so on every later report."""
    _append(store, 9, "a")
    kept = Resumable()
    seen = kept.report(store).head
    assert seen is not None and seen.position == 9
    _drop_triggers(store, raw)
    raw.execute(text("DELETE FROM flows_journal_events WHERE position >= 8"))
    raw.commit()
    checked.clear()
    report = kept.report(store)
    assert checked == list(range(1, 8))
    assert report == verify(store, anchor=seen) and not report.ok and report.entries_checked == 7
    assert report.first_break is not None and report.first_break.what == "anchor"
    assert report.first_break.position == 9 and report.first_break.detail == "the anchored entry is missing"
    assert verify(store).ok  # what is left links up: only the earlier check can tell
    # New entries after the rollback: position 9 holds another entry now, still reported.
    store.journal.append_many_unfenced("run-x", [NewEntry("step", {"k": k}) for k in range(2)], source_id="z")
    later = kept.report(store)
    assert later == verify(store, anchor=seen) and not later.ok and later.entries_checked == 9
    assert later.first_break is not None and later.first_break.what == "anchor"
    assert later.first_break.detail == "the anchored entry has another hash"
    assert not kept.report(store, from_start=True).ok  # for as long as this check is kept


def test_new_streams_and_a_broken_link_to_an_earlier_entry_are_seen(store: fencepost.Store, raw,
                                                                     checked) -> None:
    """Going on, each stream's earlier end is read from the journal (nothing per stream is kept
    between reports): a new entry whose stream link does not match it is a break, as for verify."""
    _append(store, 9, "a")
    kept = Resumable()
    kept.report(store)
    assert kept._checker is not None and kept._checker.streams == {}
    store.journal.append_unfenced("run-new", "step", {"k": 1}, source_id="n")
    store.journal.append_unfenced("run-1", "step", {"k": 2}, source_id="n")
    _drop_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET stream_prev_hash = :h WHERE position = 11"), {"h": "1" * 64})
    raw.commit()
    checked.clear()
    report = kept.report(store)
    assert checked == [10, 11]
    checked.clear()
    assert report == verify(store) and report.streams_checked == 4 and not report.ok
    assert [(b.position, b.what) for b in report.first_breaks] == [(11, "stream_link"), (11, "entry_hash")]


def test_a_journal_with_a_break_is_checked_whole_at_every_report(store: fencepost.Store, raw, checked) -> None:
    """Going on relies on an intact chain (each stream's highest seq is then its latest entry); once
    a break is known, every report checks the whole journal and says what verify says. Found by
    review: an entry whose stored seq was raised out of order made a resumed report link the
    stream's next entry to it, and miss the seq and link breaks verify reports there."""
    _append(store, 9, "a")
    _drop_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET seq = 7 WHERE position = 4"))
    raw.commit()
    kept = Resumable()
    first = kept.report(store)
    assert not first.ok and first == verify(store)
    store.journal.append_unfenced("run-0", "step", {"k": 1}, source_id="z")
    checked.clear()
    report = kept.report(store)
    assert checked == list(range(1, 11))
    checked.clear()
    assert report == verify(store)
    assert (10, "stream_link") in [(b.position, b.what) for b in report.first_breaks]


def test_reports_at_once_are_taken_one_at_a_time(store: fencepost.Store, raw) -> None:
    """Found by review: a resumed report that ended after a whole one (``from_start``) put back its
    older state, losing the break the whole pass had found while keeping its time. Calls now run one
    after the other, each from what the last one left."""
    _append(store, 9, "a")
    kept = Resumable()
    assert kept.report(store).ok
    _drop_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET payload_json = :p WHERE position = 4"), {"p": '{"x":1}'})
    raw.commit()
    store.journal.append_unfenced("run-1", "step", {"k": 1}, source_id="z")
    entered, release = threading.Event(), threading.Event()
    check = _Checker.check

    def slow(self, row) -> None:
        if threading.current_thread().name == "resumed":
            entered.set()
            release.wait(10)
        check(self, row)

    out: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_Checker, "check", slow)
        resumed = threading.Thread(target=lambda: out.setdefault("resumed", kept.report(store)), name="resumed")
        resumed.start()
        assert entered.wait(10)
        whole = threading.Thread(target=lambda: out.setdefault("whole", kept.report(store, from_start=True)))
        whole.start()
        time.sleep(0.2)  # the whole pass waits for the resumed one
        assert "whole" not in out
        release.set()
        resumed.join(10)
        whole.join(10)
    assert out["resumed"].ok and not out["whole"].ok
    later = kept.report(store)
    assert later == verify(store) and not later.ok


def test_the_console_cache_lets_a_closed_store_go(tmp_path) -> None:
    """Found by review: the console's verifications are kept per store in a weak mapping, but each
    held its store, so no store the journal page had shown was ever freed."""
    from fencepost.ui import views

    gone = []
    for i in range(3):
        s = fencepost.open(f"sqlite:///{tmp_path / f'{i}.db'}")
        s.journal.append_unfenced("run", "step", {"i": i}, source_id="w")
        assert views.journal_overview(s)["report"].ok
        gone.append(weakref.ref(s))
        s.close()
        del s
    gc.collect()
    assert [r() for r in gone] == [None, None, None]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_connection_lost_while_reading_a_stream_end_is_retried(store: fencepost.Store) -> None:
    """Found by review: a failure while reading a stream's earlier end was taken for an unreadable
    value and a whole pass followed on the dead connection, so a lost connection failed the report
    (verify's read is retried) and a server error was reported as the aborted transaction's. Only
    a value that cannot be decoded starts over now; anything else is the store's to handle. The
    server ends the session at that statement (``pg_terminate_backend``)."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.engine import Engine

    from tests.conftest import require_postgres

    _append(store, 9, "a")
    kept = Resumable()
    assert kept.report(store).ok
    store.journal.append_unfenced("run-1", "step", {"k": 1}, source_id="z")
    killer = create_engine(require_postgres())
    fired: list[int] = []

    def before(_conn, cursor, statement, _params, _context, _many) -> None:
        if not fired and "position <=" in statement and "seq DESC" in statement:
            fired.append(cursor.connection.info.backend_pid)
            with killer.begin() as k:
                k.execute(text("SELECT pg_terminate_backend(:p)"), {"p": fired[0]})

    event.listen(Engine, "before_cursor_execute", before)
    try:
        report = kept.report(store)
    finally:
        event.remove(Engine, "before_cursor_execute", before)
        killer.dispose()
    assert fired, "the stream end was never read"
    assert report == verify(store) and report.ok and report.entries_checked == 10
