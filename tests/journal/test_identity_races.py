"""Races on one idempotency identity, run as races: threads, each with its own store (its own
connections) on one database, released at a barrier, append the same ``(run, source, sourceSeq)``.
The identity check and the insert share the serialized write transaction, so whatever commits
between one writer's look-up and another's insert is found by that other writer (UPSTREAM-TESTS B6
JN-15, JN-39..41). Every test runs on SQLite and PostgreSQL."""

from __future__ import annotations

from functools import partial
from typing import Any

import fencepost
from fencepost.journal import Accepted, Duplicate
from tests.conftest import race_threads
from tests.journal.conftest import A, hold, rows

WRITERS = 6


def _race(db_url: str, calls: list) -> list[Any]:
    """Run ``calls[i](store_i)`` on WRITERS threads released together; each call's receipt or error."""
    stores = [fencepost.open(db_url) for _ in calls]
    try:
        return race_threads([partial(calls[i], stores[i]) for i in range(len(calls))], catch=fencepost.JournalError)
    finally:
        for s in stores:
            s.close()


def test_the_same_identity_raced_on_both_channels_commits_once(store: fencepost.Store, db_url: str) -> None:
    """JN-15, JN-39, JN-40: fenced and unfenced appends of one identity and payload race: exactly
    one is ``Accepted``; every other is ``Duplicate`` of that row (its seq and position, committed);
    one row, at seq 0, sourceSeq 5."""
    hold(store, "run", A)

    def fenced(s):
        return s.journal.append("run", "t", {"value": 1}, owner=A, source_id="producer", source_seq=5)

    def unfenced(s):
        return s.journal.append_unfenced("run", "t", {"value": 1}, source_id="producer", source_seq=5)

    got = _race(db_url, [fenced if i % 2 else unfenced for i in range(WRITERS)])
    accepted = [r for r in got if type(r) is Accepted]
    assert len(accepted) == 1, got
    (winner,) = accepted
    assert (winner.seq, winner.source_seq) == (0, 5)
    assert [r for r in got if r is not winner] == [Duplicate(0, 5, winner.position, "committed")] * (WRITERS - 1)
    assert [(r[1], r[3]) for r in rows(store, "run")] == [(0, 5)]


def test_a_divergent_commit_of_the_same_identity_wins_and_the_others_conflict(store: fencepost.Store,
                                                                             db_url: str) -> None:
    """JN-41: appends of one identity with payloads ``{value: 1}`` and ``{value: 2}`` race: exactly
    one is ``Accepted``; those with the winner's payload are ``Duplicate``, those with the other are
    ``idempotency_conflict``; the stored payload is the winner's, in one row."""
    payloads = [{"value": 1 + i % 2} for i in range(WRITERS)]
    calls = [lambda s, p=p: s.journal.append_unfenced("run", "t", p, source_id="producer", source_seq=5)
             for p in payloads]
    got = _race(db_url, calls)
    winners = [i for i, r in enumerate(got) if type(r) is Accepted]
    assert len(winners) == 1, got
    won = payloads[winners[0]]
    for i, r in enumerate(got):
        if i == winners[0]:
            continue
        if payloads[i] == won:
            assert type(r) is Duplicate and r.seq == 0, r
        else:
            assert isinstance(r, fencepost.JournalError) and r.code == "idempotency_conflict", r
    stored = rows(store, "run")
    assert len(stored) == 1 and store.journal.entries("run").entries[0].payload == won
