"""Owner-fenced appends (UPSTREAM-TESTS B1, B2, B3 and the journal half of B4)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event, text

import fencepost
from fencepost.journal import Accepted, Duplicate, NewEntry, OwnerId
from fencepost.journal.consensus import SqlConsensus
from tests.journal.conftest import A, B, hold, release, rows


def test_append_by_the_holder_is_accepted(store: fencepost.Store) -> None:
    """JF-02: A holds the run; A's fenced append is Accepted at seq 0."""
    hold(store, "run-1", A)
    assert store.journal.append("run-1", "step", {"n": 1}, owner=A, source_id="w") == Accepted(0, 0, 1)


def test_append_by_another_owner_is_fence_lost_and_writes_nothing(store: fencepost.Store) -> None:
    """JF-03: the run is held by B; A's append fails fence_lost and no row is written."""
    hold(store, "run-1", B)
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append("run-1", "step", {"n": 1}, owner=A, source_id="w")
    assert err.value.code == "fence_lost"
    assert rows(store) == []


@pytest.mark.parametrize(
    "owner",
    [OwnerId("", 101, "owner-a"), OwnerId("host-a", 101, "")],
    ids=["empty-host", "empty-nonce"],
)
def test_owner_with_empty_host_or_nonce_is_fence_lost(store: fencepost.Store, owner: OwnerId) -> None:
    """JF-04 (first half): an owner no lease can carry is simply not the holder."""
    hold(store, "run-1", A)
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append("run-1", "step", {}, owner=owner, source_id="w")
    assert err.value.code == "fence_lost"
    assert rows(store) == []


@pytest.mark.parametrize(
    "owner",
    [OwnerId("host-a", 42.5, "owner-a"), OwnerId("host-a", float("nan"), "owner-a"),  # type: ignore[arg-type]
     OwnerId("host-a", float("inf"), "owner-a"), OwnerId("host-a", -1, "owner-a"),  # type: ignore[arg-type]
     OwnerId("host-a", True, "owner-a"), None, ("host-a", 101, "owner-a")],  # type: ignore[arg-type]
    ids=["fractional-pid", "nan-pid", "infinite-pid", "negative-pid", "bool-pid", "none", "tuple"],
)
def test_malformed_owner_is_invalid_event_not_fence_lost(store: fencepost.Store, owner: object) -> None:
    """JF-04 (second half): a malformed fence is invalid input, named without its value."""
    hold(store, "run-1", A)
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append("run-1", "step", {}, owner=owner, source_id="w")  # type: ignore[arg-type]
    assert err.value.code == "invalid_event"
    assert "append requires a well-formed owner fence" in str(err.value)
    assert rows(store) == []


def test_same_identity_twice_under_the_fence_is_accepted_then_duplicate(store: fencepost.Store) -> None:
    """JF-05 / JG-04: a retry while held is Duplicate{seq, sourceSeq, status committed}."""
    hold(store, "run-1", A)
    first = store.journal.append("run-1", "step", {"n": 1}, owner=A, source_id="w", source_seq=0)
    again = store.journal.append("run-1", "step", {"n": 1}, owner=A, source_id="w", source_seq=0)
    assert first == Accepted(seq=0, source_seq=0, position=1)
    assert again == Duplicate(seq=0, source_seq=0, position=1, status="committed")
    assert len(rows(store)) == 1


@pytest.mark.parametrize("loss", ["lease-deleted", "pid-changed"])
@pytest.mark.parametrize("op", ["fresh", "duplicate"])
def test_lost_fence_refuses_fresh_and_duplicate_appends_leaving_rows_identical(
    store: fencepost.Store, loss: str, op: str
) -> None:
    """JF-08: after the lease is deleted or its pid changed, both a fresh append and a duplicate of a
    committed identity are fence_lost (the fence is checked before dedup); rows are byte-identical."""
    hold(store, "run-1", A)
    for i in range(3):
        store.journal.append("run-1", "step", {"i": i}, owner=A, source_id="w", source_seq=i)
    before = rows(store)
    if loss == "lease-deleted":
        release(store, "run-1")
    else:
        store.db.write(lambda c: c.execute(text("UPDATE flows_consensus_leases SET owner_pid = 7")))
    seq, payload = (3, {"i": 3}) if op == "fresh" else (2, {"i": 2})
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append("run-1", "step", payload, owner=A, source_id="w", source_seq=seq)
    assert err.value.code == "fence_lost"
    assert rows(store) == before


def test_lease_table_dropped_is_sink_failed_with_persistence_cause(store: fencepost.Store) -> None:
    """JF-01: the consensus cannot be read: sink_failed whose cause is persistence_failed; no event."""
    hold(store, "run-1", A)
    store.db.write(lambda c: c.exec_driver_sql("DROP TABLE flows_consensus_leases"))
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append("run-1", "step", {}, owner=A, source_id="w")
    assert err.value.code == "sink_failed"
    assert err.value.cause_code == "persistence_failed"  # type: ignore[attr-defined]
    assert rows(store) == []


def test_zombie_owner_is_refused_while_successor_appends(db_url: str, clock) -> None:
    """JD-01: two stores (two connection pools) on one database. The stale owner's append waits
    before its transaction; the successor takes the lease and appends; the zombie, released, then
    retries: fence_lost both times, and only the successor's row exists."""
    zombie = fencepost.open(db_url, clock=clock)
    successor = fencepost.open(db_url, clock=clock)
    try:
        hold(zombie, "run-1", A)
        go = threading.Event()
        outcome: list[str] = []

        def zombie_append() -> None:
            go.wait(10)
            try:
                zombie.journal.append("run-1", "step", {"by": "zombie"}, owner=A, source_id="zombie")
                outcome.append("accepted")
            except fencepost.JournalError as exc:
                outcome.append(exc.code)

        t = threading.Thread(target=zombie_append)
        t.start()
        hold(successor, "run-1", B)
        receipt = successor.journal.append("run-1", "step", {"by": "successor"}, owner=B, source_id="successor")
        go.set()
        t.join(10)
        release(successor, "run-1")
        with pytest.raises(fencepost.JournalError) as err:
            zombie.journal.append("run-1", "step", {"by": "zombie"}, owner=A, source_id="zombie")
        assert receipt == Accepted(seq=0, source_seq=0, position=1)
        assert outcome == ["fence_lost"]
        assert err.value.code == "fence_lost"
        assert [(r[0], r[1], r[2]) for r in rows(successor)] == [("run-1", 0, "successor")]
    finally:
        zombie.close()
        successor.close()


def test_fence_outranks_dedup_for_a_stale_owner_replaying_the_successors_identity(store: fencepost.Store) -> None:
    """JD-02: the successor committed identity (shared, 0); the stale owner emits the identical
    identity and payload: fence_lost, one row."""
    hold(store, "run-1", B)
    store.journal.append("run-1", "step", {"v": 1}, owner=B, source_id="shared", source_seq=0)
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append("run-1", "step", {"v": 1}, owner=A, source_id="shared", source_seq=0)
    assert err.value.code == "fence_lost"
    assert len(rows(store)) == 1


def test_fenced_append_is_visible_on_return(store: fencepost.Store) -> None:
    """JG-01: the owner's append has committed when it returns: its row is there, no flush needed."""
    hold(store, "run-1", A)
    receipt = store.journal.append("run-1", "step", {}, owner=A, source_id="w")
    assert [r[1] for r in rows(store, "run-1")] == [receipt.seq]


def test_after_reclaim_old_owner_is_refused_and_new_owner_appends(store: fencepost.Store) -> None:
    """JG-02 / CC-08: after B takes the run, A's append is fence_lost; B's is Accepted at the next seq."""
    hold(store, "run-1", A)
    for i in range(4):
        assert isinstance(store.journal.append("run-1", "step", {"i": i}, owner=A, source_id="a"), Accepted)
    hold(store, "run-1", B, at_ms=30_001)
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append("run-1", "step", {"i": 9}, owner=A, source_id="a")
    assert err.value.code == "fence_lost"
    assert store.journal.append("run-1", "step", {}, owner=B, source_id="b").seq == 4
    assert [r[1] for r in rows(store, "run-1")] == [0, 1, 2, 3, 4]


def test_unfenced_appends_are_accepted_whoever_holds_the_run(store: fencepost.Store) -> None:
    """JG-03: the unfenced channel after a reclaim: two appends Accepted at seqs 0, 1."""
    hold(store, "run-1", B)
    r0 = store.journal.append_unfenced("run-1", "admission", {"k": 0}, source_id="sweeper")
    r1 = store.journal.append_unfenced("run-1", "admission", {"k": 1}, source_id="sweeper")
    assert (r0.seq, r1.seq) == (0, 1)


def test_retry_after_reclaim_is_fence_lost_even_for_a_committed_identity(store: fencepost.Store) -> None:
    """JG-04: Duplicate while held, fence_lost after the reclaim; rows unchanged."""
    hold(store, "run-1", A)
    store.journal.append("run-1", "step", {}, owner=A, source_id="w", source_seq=0)
    assert store.journal.append("run-1", "step", {}, owner=A, source_id="w", source_seq=0).status == "committed"
    before = rows(store)
    hold(store, "run-1", B)
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append("run-1", "step", {}, owner=A, source_id="w", source_seq=0)
    assert err.value.code == "fence_lost"
    assert rows(store) == before


def test_takeover_and_stale_append_in_one_transaction_is_fence_lost(store: fencepost.Store) -> None:
    """CC-09: inside one transaction B takes the lease, then A appends: fence_lost; no entries."""
    hold(store, "run-1", A)
    seen: list[str] = []

    def body(tx) -> None:
        tx.conn.execute(
            text("UPDATE flows_consensus_leases SET owner_host_id = :h, owner_pid = :p, owner_nonce = :n"),
            {"h": B.host_id, "p": B.pid, "n": B.nonce},
        )
        try:
            tx.append("run-1", "step", {}, owner=A, source_id="a")
        except fencepost.JournalError as exc:
            seen.append(exc.code)

    store.journal.transact(body)
    assert seen == ["fence_lost"]
    assert store.journal.entries("run-1").entries == []


def test_fenced_batch_after_loss_writes_nothing(store: fencepost.Store) -> None:
    """A fenced multi-entry append is refused whole when the owner lost the run."""
    hold(store, "run-1", B)
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append_many("run-1", [NewEntry("step", {"i": i}) for i in range(3)], owner=A, source_id="w")
    assert err.value.code == "fence_lost"
    assert rows(store) == []


class _DeniesHostB(SqlConsensus):
    """An injected strategy refining the built-in guard: host-b is never admitted."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def guard(self, conn, run_id: str, owner: OwnerId) -> bool:
        self.asked.append(run_id)
        return owner.host_id != "host-b" and super().guard(conn, run_id, owner)


def test_an_injected_strategy_that_refines_the_guard_is_still_asked(db_url: str) -> None:
    """The built-in strategy's fence check rides the head lookup; a strategy that overrides
    ``guard`` (even a subclass of the built-in one) is asked itself, and its refusal holds."""
    strategy = _DeniesHostB()
    with fencepost.open(db_url, consensus=strategy) as store:
        hold(store, "run-1", B)
        with pytest.raises(fencepost.JournalError) as err:
            store.journal.append("run-1", "step", {"n": 1}, owner=B, source_id="w")
        assert err.value.code == "fence_lost"
        assert rows(store) == []
        hold(store, "run-2", A)
        assert store.journal.append("run-2", "step", {"n": 1}, owner=A, source_id="w") == Accepted(0, 0, 1)
        assert strategy.asked == ["run-1", "run-2"]


def test_the_built_in_fence_check_and_the_head_lookup_are_one_statement(store: fencepost.Store) -> None:
    """A fenced append by the holder sends two journal statements (the fence check with the heads,
    then the insert); a refused one sends only the first, and writes nothing."""
    seen: list[str] = []

    def on_before(_conn, _cursor, statement, parameters, _context, _many):
        seen.append(statement)
        return statement, parameters

    hold(store, "run-1", A)
    event.listen(store.db.engine, "before_cursor_execute", on_before, retval=True)
    try:
        store.journal.append("run-1", "step", {"n": 1}, owner=A, source_id="w")
        with pytest.raises(fencepost.JournalError):
            store.journal.append("run-1", "step", {"n": 2}, owner=B, source_id="w")
    finally:
        event.remove(store.db.engine, "before_cursor_execute", on_before)
    journal_statements = [s for s in seen if "flows_journal_events" in s or "flows_consensus_leases" in s]
    assert len(journal_statements) == 3, journal_statements
    assert "flows_consensus_leases" in journal_statements[0] and "flows_journal_events" in journal_statements[0]
    assert journal_statements[1].lstrip().upper().startswith("INSERT INTO FLOWS_JOURNAL_EVENTS")
    assert "flows_consensus_leases" in journal_statements[2]
    assert [r[4] for r in rows(store)] == ['{"n":1}']
