"""``verify`` and ``replay_all`` report how far they got through ``on_progress``, on both backends.

Defect: both read the whole journal (a million entries: ~15 s on SQLite, ~90 s on PostgreSQL) and
said nothing until the end, so ``fencepost journal verify`` could draw no progress bar.
"""

from __future__ import annotations

import sys

import pytest

import fencepost
from fencepost.errors import JournalError
from fencepost.journal import NewEntry, verify
from fencepost.journal.owner import OwnerId
from fencepost.journal.replay import replay_all
from fencepost.runstore.outcomes import Claimed

A = OwnerId("host-a", 101, "owner-a")


def _settle(store: fencepost.Store, run_id: str) -> None:
    """A run claimed, activated and completed by ``A``: ownership facts on its companion stream."""
    store.runs.create(run_id, "{}")
    row = store.runs.get(run_id)
    claimed = store.runs.claim(run_id, row.snapshot(), A, store.clock.now_ms())
    assert isinstance(claimed, Claimed)
    store.runs.activate(run_id, A, claimed.claimed_at_ms, row)
    store.runs.transition_owned(run_id, A, "completed")


def test_verify_reports_progress_per_page_ending_at_the_total(store: fencepost.Store, monkeypatch) -> None:
    """Called with (0, total) first, then after every page with the entries checked so far,
    increasing, the last call at the total; the report is the same as without a callback."""
    monkeypatch.setattr(sys.modules["fencepost.journal.verify"], "PAGE", 5)
    for run in ("a", "b"):
        store.journal.append_many_unfenced(run, [NewEntry("step", {"i": i}) for i in range(11)], source_id="w")
    calls: list[tuple[int, int]] = []
    report = verify(store, on_progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 22), (5, 22), (10, 22), (15, 22), (20, 22), (22, 22)]
    assert report == verify(store)
    assert report.ok and report.entries_checked == 22


def test_verify_progress_of_an_empty_journal_is_one_call(store: fencepost.Store) -> None:
    calls: list[tuple[int, int]] = []
    assert verify(store, on_progress=lambda done, total: calls.append((done, total))).entries_checked == 0
    assert calls == [(0, 0)]


def test_an_interrupt_raised_by_the_callback_ends_verify(store: fencepost.Store, monkeypatch) -> None:
    """What Ctrl-C does between two pages: the exception propagates, no report, nothing retried."""
    monkeypatch.setattr(sys.modules["fencepost.journal.verify"], "PAGE", 5)
    store.journal.append_many_unfenced("a", [NewEntry("step", {"i": i}) for i in range(12)], source_id="w")
    calls: list[int] = []

    def interrupt(done: int, total: int) -> None:
        calls.append(done)
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        verify(store, on_progress=interrupt)
    assert calls == [0, 5]


def test_replay_all_reports_progress_per_stream_ending_at_the_total(store: fencepost.Store) -> None:
    for i in range(3):
        _settle(store, f"r{i}")
    calls: list[tuple[int, int]] = []
    summary = replay_all(store, on_progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert summary == replay_all(store) and summary.runs == 3 and summary.ok


def test_replay_all_progress_with_no_facts_is_one_call(store: fencepost.Store) -> None:
    calls: list[tuple[int, int]] = []
    assert replay_all(store, on_progress=lambda done, total: calls.append((done, total))).runs == 0
    assert calls == [(0, 0)]


@pytest.mark.parametrize("call", [verify, replay_all])
def test_an_on_progress_that_is_not_callable_is_refused(store: fencepost.Store, call) -> None:
    with pytest.raises(JournalError) as caught:
        call(store, on_progress=5)
    assert caught.value.code == "invalid_event" and "on_progress" in str(caught.value)
