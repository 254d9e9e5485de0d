"""Defect (found by a review, SQLite and PostgreSQL): ``ShardSet.journal.transact(run_id, fn)`` never
checked ``run_id``: ``None``, ``5``, ``""`` or ``"x\\x00"`` ran ``fn`` on the first shard. And an
append inside it for a run another shard holds was accepted: the entry landed in the transaction's
shard's journal, where ``journal.entries`` through the set never looks, so it could not be seen.

Now a bad ``run_id`` is refused as the journal's other calls refuse one (``JournalError
invalid_event`` naming ``run_id``, never the value) before ``fn`` runs. An append inside the
transaction (``tx.append``, ``append_unfenced``, ``append_many``, ``append_many_unfenced``) for a
run that belongs to another shard (it holds the run, or a new run of that id is placed there) is
refused with ``invalid_event`` naming both shards, before anything is written; ``fn`` may catch
it and go on, and its other writes commit."""

from __future__ import annotations

import pytest

import fencepost
from fencepost import OwnerId
from fencepost.clock import ManualClock
from fencepost.errors import JournalError
from fencepost.journal import NewEntry

A = OwnerId("host-a", 101, "owner-a")


@pytest.fixture
def shards(shard_urls):
    s = fencepost.open_shards(shard_urls(2), clock=ManualClock(1_000))
    yield s
    s.close()


def _on(shards, name: str, *, taken: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    return next(rid for rid in (f"run-{i}" for i in range(200)) if shards.place(rid) == name and rid not in taken)


def _counts(shards, run_ids) -> dict[tuple[str, str], int]:
    return {(name, rid): len(store.journal.entries(rid).entries) for name, store in shards.items() for rid in run_ids}


@pytest.mark.parametrize("run_id", [None, 5, "", "x\x00", b"run-1", "S3CR3T\udc80"], ids=repr)
def test_a_bad_run_id_is_refused_before_fn_runs(shards, run_id) -> None:
    ran = []
    with pytest.raises(JournalError) as err:
        shards.journal.transact(run_id, lambda tx: ran.append(tx))
    assert err.value.code == "invalid_event" and "run_id" in str(err.value), err.value
    assert "S3CR3T" not in str(err.value)
    assert ran == []


def test_a_fn_that_is_not_callable_is_refused_as_one_store_refuses_it(shards) -> None:
    with pytest.raises(JournalError) as err:
        shards.journal.transact("run-1", "not callable")
    assert err.value.code == "invalid_event" and "fn" in str(err.value)


@pytest.mark.parametrize("how", ["append", "append_unfenced", "append_many", "append_many_unfenced"])
def test_an_append_for_a_run_another_shard_holds_is_refused_and_writes_nothing(shards, how) -> None:
    here = _on(shards, "shard-0")
    there = _on(shards, "shard-1")
    for rid in (here, there):
        shards.runs.create(rid, "{}")
        shards.runs.claim_and_own(rid, fencepost.RunSnapshot("pending", None, None), A, 1_000)
    before = _counts(shards, [here, there])
    calls = {
        "append": lambda tx, rid: tx.append(rid, "ev", {"x": 1}, owner=A, source_id="s"),
        "append_unfenced": lambda tx, rid: tx.append_unfenced(rid, "ev", {"x": 1}, source_id="s"),
        "append_many": lambda tx, rid: tx.append_many(rid, [NewEntry("ev", {"x": 1})], owner=A, source_id="s"),
        "append_many_unfenced": lambda tx, rid: tx.append_many_unfenced(rid, [NewEntry("ev", {"x": 1})],
                                                                        source_id="s"),
    }
    with pytest.raises(JournalError) as err:
        shards.journal.transact(here, lambda tx: calls[how](tx, there))
    assert err.value.code == "invalid_event" and "run_id" in str(err.value), err.value
    assert "shard-1" in str(err.value) and "shard-0" in str(err.value), err.value
    assert _counts(shards, [here, there]) == before

    def caught_then_own(tx):  # the refusal writes nothing and leaves the transaction usable
        with pytest.raises(JournalError):
            calls[how](tx, there)
        return calls[how](tx, here)

    shards.journal.transact(here, caught_then_own)
    assert len(shards.journal.entries(here).entries) == 1
    assert shards.journal.entries(there).entries == []
    assert all(not store.journal.entries(there).entries for _, store in shards.items())


def test_an_append_for_a_new_run_placed_on_another_shard_is_refused(shards) -> None:
    here = _on(shards, "shard-0")
    elsewhere = _on(shards, "shard-1")  # no shard holds it: a new run of this id is placed on shard-1
    shards.runs.create(here, "{}")
    with pytest.raises(JournalError) as err:
        shards.journal.transact(here, lambda tx: tx.append_unfenced(elsewhere, "ev", {}, source_id="s"))
    assert err.value.code == "invalid_event" and "shard-1" in str(err.value)
    assert all(not store.journal.entries(elsewhere).entries for _, store in shards.items())


def test_appends_for_runs_of_the_same_shard_commit_together(shards) -> None:
    here = _on(shards, "shard-0")
    other = _on(shards, "shard-0", taken={here})
    for rid in (here, other):
        shards.runs.create(rid, "{}")

    def both(tx):
        tx.append_unfenced(here, "ev", {"n": 1}, source_id="s")
        tx.append_unfenced(other, "ev", {"n": 2}, source_id="s")
        return "done"

    assert shards.journal.transact(here, both) == "done"
    assert [e.payload for e in shards.journal.entries(here).entries] == [{"n": 1}]
    assert [e.payload for e in shards.journal.entries(other).entries] == [{"n": 2}]


def test_a_bad_run_id_inside_the_transaction_is_refused_in_the_journal_s_words(shards) -> None:
    here = _on(shards, "shard-0")
    shards.runs.create(here, "{}")
    with pytest.raises(JournalError) as err:
        shards.journal.transact(here, lambda tx: tx.append_unfenced("x\x00", "ev", {}, source_id="s"))
    assert err.value.code == "invalid_event" and "journal input contract" in str(err.value)
