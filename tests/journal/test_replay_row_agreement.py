"""Replay checks the facts' end against the run row: a run's newest facts removed cannot replay clean.

Defect (found by an audit review, both backends): a run's last ownership fact (its ``released`` at
settlement) deleted by hand, with other runs' entries appended after it (as concurrent workers
always do), replayed as "consistent": the stream's own chain still links, and the log entry after
the stream's new last fact is another run's entry that links correctly to it, so the one log check
replay made saw nothing. The replay showed the owner's tenure still open while the run row was
``completed`` with no owner; only ``journal verify`` noticed the gap, at another run's entry.
Every change of who owns or claims a run writes its fact in the same transaction as the row, so
replay now reads the run row in the same snapshot as the facts and reports ``row_disagrees`` at
the last fact when the row's owner or pending claim is not the one the facts end with.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

import fencepost
from fencepost.journal import companion_stream, ownership_history, replay_all
from fencepost.journal.owner import OwnerId
from fencepost.runstore.outcomes import Claimed
from tests.journal.conftest import A, B


def _drop_guards(store: fencepost.Store, raw) -> None:
    on = " ON flows_journal_events" if store.db.name == "postgresql" else ""
    for name in ("flows_journal_events_no_update_v1", "flows_journal_events_no_delete_v1"):
        raw.execute(text(f"DROP TRIGGER {name}{on}"))
    raw.commit()


def _own(store: fencepost.Store, run_id: str, owner: OwnerId) -> None:
    store.runs.create(run_id, "{}")
    row = store.runs.get(run_id)
    claimed = store.runs.claim(run_id, row.snapshot(), owner, store.clock.now_ms())
    assert isinstance(claimed, Claimed)
    store.runs.activate(run_id, owner, claimed.claimed_at_ms, row)


def _settled_then_others(store: fencepost.Store) -> None:
    """Run ``r`` owned by A; run ``other`` claimed and owned by B; ``r`` completed; ``other``
    completed: in the log, ``other``'s facts lie between ``r``'s activation and its release, and
    ``other``'s release follows ``r``'s, as with concurrent workers."""
    _own(store, "r", A)
    _own(store, "other", B)
    store.runs.transition_owned("r", A, "completed")
    store.runs.transition_owned("other", B, "completed")


def _delete_last_fact(raw, run_id: str) -> int:
    stream = companion_stream(run_id)
    last = raw.execute(text("SELECT max(seq) FROM flows_journal_events WHERE run_id = :s"), {"s": stream}).scalar()
    raw.execute(text("DELETE FROM flows_journal_events WHERE run_id = :s AND seq = :q"), {"s": stream, "q": last})
    raw.commit()
    return int(last)


def test_an_intact_history_agrees_with_its_row(store: fencepost.Store) -> None:
    _settled_then_others(store)
    for run_id in ("r", "other"):
        assert ownership_history(store, run_id).ok, ownership_history(store, run_id)
    assert replay_all(store).ok


def test_a_settled_runs_last_fact_removed_with_later_entries_of_other_runs_is_reported(
        store: fencepost.Store, raw) -> None:
    _settled_then_others(store)
    _drop_guards(store, raw)
    removed = _delete_last_fact(raw, "r")
    history = ownership_history(store, "r")
    assert not history.ok
    [violation] = history.violations
    assert violation.rule == "row_disagrees" and violation.seq == removed - 1, history
    assert "owner" in violation.detail and "journal verify" in violation.detail
    assert history.intervals[-1].end_position is None  # replayed as stored: the tenure left open
    summary = replay_all(store)
    assert not summary.ok and summary.violations == {"row_disagrees": 1}
    assert ownership_history(store, "other").ok


def test_a_pending_claims_fact_removed_is_reported(store: fencepost.Store, raw) -> None:
    """A claim whose ``claimed`` fact was removed: the row holds a claim no fact gives."""
    _own(store, "r", A)
    store.runs.transition_owned("r", A, "suspended")
    _own(store, "other", A)
    row = store.runs.get("r")
    assert isinstance(store.runs.claim("r", row.snapshot(), B, store.clock.now_ms()), Claimed)
    store.runs.transition_owned("other", A, "completed")
    _drop_guards(store, raw)
    _delete_last_fact(raw, "r")
    [violation] = ownership_history(store, "r").violations
    assert violation.rule == "row_disagrees" and "claim" in violation.detail


def test_a_run_row_whose_owner_was_edited_by_hand_is_reported(store: fencepost.Store, raw) -> None:
    _own(store, "r", A)
    raw.execute(text("UPDATE flows_runs SET owner_pid = 4242 WHERE run_id = 'r'"))
    raw.commit()
    [violation] = ownership_history(store, "r").violations
    assert violation.rule == "row_disagrees" and "4242" not in violation.detail


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
def test_a_deleted_run_replays_from_its_facts_alone(store: fencepost.Store) -> None:
    """No row to compare with: the facts are judged alone, as before."""
    _own(store, "r", A)
    store.runs.transition_owned("r", A, "completed")
    store.runs.delete("r")
    history = ownership_history(store, "r")
    assert history.ok and history.facts >= 3


def _delete_stream(raw, run_id: str) -> int:
    deleted = raw.execute(text("DELETE FROM flows_journal_events WHERE run_id = :s"),
                          {"s": companion_stream(run_id)}).rowcount
    raw.commit()
    return deleted


def test_a_settled_run_whose_every_fact_was_removed_is_reported(store: fencepost.Store, raw) -> None:
    """Defect (last session's audit note, both backends): every ownership fact of a completed run
    deleted from the middle of the journal replayed as "consistent" (nothing to replay, nothing to
    compare with the row), and ``replay_all`` did not list the run at all. Its row was started and
    settled by an owner, which writes facts in the same transaction."""
    _settled_then_others(store)
    _drop_guards(store, raw)
    assert _delete_stream(raw, "r") >= 3
    history = ownership_history(store, "r")
    assert not history.ok and history.facts == 0 and history.intervals == []
    [violation] = history.violations
    assert violation.rule == "row_disagrees" and violation.seq == -1 and violation.position == -1
    assert "no ownership facts" in violation.detail and "journal verify" in violation.detail
    summary = replay_all(store)
    assert not summary.ok and summary.violations == {"row_disagrees": 1}
    assert summary.runs == 2 and [h.run_id for h in summary.histories] == ["other", "r"]
    assert next(h for h in summary.histories if h.run_id == "r") == history


def test_a_pending_claims_only_fact_removed_is_reported(store: fencepost.Store, raw) -> None:
    """A run claimed but never started: its one ``claimed`` fact removed leaves a claim no fact gives."""
    store.runs.create("r", "{}")
    row = store.runs.get("r")
    assert isinstance(store.runs.claim("r", row.snapshot(), A, store.clock.now_ms()), Claimed)
    _own(store, "other", B)
    _drop_guards(store, raw)
    assert _delete_stream(raw, "r") == 1
    [violation] = ownership_history(store, "r").violations
    assert violation.rule == "row_disagrees" and "claim" in violation.detail
    assert replay_all(store).violations == {"row_disagrees": 1}


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
def test_runs_never_claimed_have_no_facts_and_replay_clean(store: fencepost.Store) -> None:
    """No facts and a row never claimed nor started: nothing is missing, and such runs are not
    counted as replayed (they have no history)."""
    store.runs.create("fresh", "{}")
    _own(store, "r", A)
    store.runs.transition_owned("r", A, "completed")
    store.runs.create("abandoned", "{}")
    row = store.runs.get("abandoned")
    claimed = store.runs.claim("abandoned", row.snapshot(), B, store.clock.now_ms())
    store.runs.abandon_claim("abandoned", B, claimed.claimed_at_ms)
    history = ownership_history(store, "fresh")
    assert history.ok and history.facts == 0
    summary = replay_all(store)
    assert summary.ok and summary.runs == 2 and [h.run_id for h in summary.histories] == ["abandoned", "r"]


def test_replay_all_lists_runs_without_facts_past_one_page(store: fencepost.Store, raw, monkeypatch) -> None:
    """The runs whose facts are all gone are found a page at a time, each once; progress counts them."""
    from fencepost.journal import replay as replay_module

    monkeypatch.setattr(replay_module, "_STREAM_PAGE", 2)
    for i in range(5):
        _own(store, f"r{i}", A)
        store.runs.transition_owned(f"r{i}", A, "completed")
    _drop_guards(store, raw)
    for i in (0, 2, 3, 4):
        _delete_stream(raw, f"r{i}")
    calls: list[tuple[int, int]] = []
    summary = replay_all(store, on_progress=lambda done, total: calls.append((done, total)))
    assert summary.runs == 5 and summary.violations == {"row_disagrees": 4}
    assert sorted(h.run_id for h in summary.histories) == [f"r{i}" for i in range(5)]
    assert calls[-1] == (5, 5) and all(done <= total for done, total in calls)
