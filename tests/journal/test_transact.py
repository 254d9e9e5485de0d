"""``Journal.transact``: a caller's own writes and its journal entries commit together, and the run
store's companion facts replay into a clean ownership history."""

from __future__ import annotations

import pytest
from sqlalchemy import text

import fencepost
from fencepost.journal import NewEntry, companion_stream, ownership_history, verify
from tests.journal.conftest import A, hold, rows


def _leases(store: fencepost.Store) -> int:
    return store.db.read(lambda c: c.execute(text("SELECT count(*) FROM flows_consensus_leases")).scalar())


def test_transact_commits_own_write_and_entries_together(store: fencepost.Store) -> None:
    hold(store, "run-1", A)

    def body(tx) -> list:
        tx.conn.execute(text("INSERT INTO flows_consensus_leases (run_id) VALUES ('side-effect')"))
        first = tx.append("run-1", "step", {"n": 1}, owner=A, source_id="w")
        rest = tx.append_many("run-1", [NewEntry("step", {"n": 2}), NewEntry("step", {"n": 3})], owner=A,
                              source_id="w")
        other = tx.append_unfenced("run-2", "admission", {}, source_id="sweeper")
        return [first, *rest, other]

    receipts = store.journal.transact(body)
    assert [(r.seq, r.position) for r in receipts] == [(0, 1), (1, 2), (2, 3), (0, 4)]
    assert _leases(store) == 2
    assert verify(store).ok


def test_transact_that_raises_commits_nothing(store: fencepost.Store) -> None:
    hold(store, "run-1", A)

    def body(tx) -> None:
        tx.conn.execute(text("INSERT INTO flows_consensus_leases (run_id) VALUES ('side-effect')"))
        tx.append("run-1", "step", {}, owner=A, source_id="w")
        raise RuntimeError("caller changed its mind")

    with pytest.raises(RuntimeError):
        store.journal.transact(body)
    assert rows(store) == [] and _leases(store) == 1
    # nothing was allocated: the next append takes seq 0 and position 1
    assert store.journal.append("run-1", "step", {}, owner=A, source_id="w").position == 1


def test_refused_append_inside_transact_leaves_it_usable(store: fencepost.Store) -> None:
    hold(store, "run-1", A)

    def body(tx) -> str:
        tx.append_unfenced("run-1", "step", {"v": 1}, source_id="w", source_seq=0)
        try:
            tx.append_unfenced("run-1", "step", {"v": 2}, source_id="w", source_seq=0)
        except fencepost.JournalError as exc:
            code = exc.code
        tx.append_unfenced("run-1", "step", {"v": 3}, source_id="w")
        return code

    assert store.journal.transact(body) == "idempotency_conflict"
    assert [r[1] for r in rows(store)] == [0, 1]


def test_run_state_write_and_journal_entry_commit_in_one_transaction(store: fencepost.Store, clock) -> None:
    """The run store's transition and the caller's journal entry commit together; a failure after
    both rolls back both (no entry without its state, no state without its entry)."""
    store.runs.create("run-1", '{"step":0}')
    got = store.runs.claim_and_own("run-1", store.runs.get("run-1"), A, clock.now_ms())
    assert type(got).__name__ == "Activated"

    def checkpoint(tx) -> None:
        store.runs.transition_owned("run-1", A, "running", state_json='{"step":1}')
        tx.append("run-1", "step.done", {"step": 1}, owner=A, source_id="engine")

    store.journal.transact(checkpoint)
    assert store.runs.get("run-1").state_json == '{"step":1}'
    assert [e.payload for e in store.journal.entries("run-1").entries] == [{"step": 1}]

    def fails(tx) -> None:
        store.runs.transition_owned("run-1", A, "running", state_json='{"step":2}')
        tx.append("run-1", "step.done", {"step": 2}, owner=A, source_id="engine")
        raise RuntimeError("crash before commit")

    with pytest.raises(RuntimeError):
        store.journal.transact(fails)
    assert store.runs.get("run-1").state_json == '{"step":1}'
    assert len(store.journal.entries("run-1").entries) == 1


def test_settled_run_refuses_late_fenced_appends_and_replays_cleanly(store: fencepost.Store, clock) -> None:
    """A released (settled) run refuses the former owner's appends with fence_lost (REFERENCE 3.2);
    the run store's own facts rebuild one closed interval with no violation."""
    store.runs.create("run-1", "{}")
    store.runs.claim_and_own("run-1", store.runs.get("run-1"), A, clock.now_ms())
    assert store.journal.append("run-1", "step", {}, owner=A, source_id="engine").seq == 0
    clock.advance(1000)
    store.runs.transition_owned("run-1", A, "completed", state_json='{"done":true}')
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append("run-1", "late", {}, owner=A, source_id="engine")
    assert err.value.code == "fence_lost"
    history = ownership_history(store, "run-1")
    assert history.ok, history.violations
    assert [(i.owner, i.ended_by) for i in history.intervals] == [(A, "released")]
    assert [e.event_type for e in store.journal.entries(companion_stream("run-1")).entries] == [
        "flows.consensus.claimed", "flows.consensus.activated", "flows.consensus.released"]
    assert verify(store).ok
