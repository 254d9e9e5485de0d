"""Run-store races between stores, not only between threads of one store.

Threads of one store share its group commit: their writes are queued and run one after the other
by a single leader, so a race among them never reaches the database as a race. Here every
contender is a thread with its own store (its own connections) on one SQLite file / PostgreSQL
schema, released together at a barrier, so each compare-and-set meets the others in the database
(RS-09, RM-17 and a steal of one stale run, as races; plus a cancel request racing the owner's
completion). Small counts: a few runs per test.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

import fencepost
from fencepost import (
    AlreadyClaimed,
    AlreadyRequested,
    CancelRequested,
    Claimed,
    OwnerId,
    SnapshotChanged,
    Terminal,
    Transitioned,
)
from fencepost.clock import ManualClock
from tests.conftest import race_threads

from .conftest import PENDING, A, ev, facts, running

CONTENDERS = 4
ROUNDS = 5


def _race(stores: list[fencepost.Store], calls: list[Callable[[fencepost.Store], Any]]) -> list[Any]:
    """Run ``calls[i](stores[i])`` on threads released together; each call's result or error."""
    return race_threads([partial(calls[i], stores[i]) for i in range(len(calls))])


@pytest.fixture
def stores(db_url: str, clock: ManualClock, store: fencepost.Store):
    """CONTENDERS stores on the test database (``store`` migrated it), group commit or not alike."""
    opened = [fencepost.open(db_url, clock=clock, group_commit=i % 2 == 0) for i in range(CONTENDERS)]
    try:
        yield opened
    finally:
        for s in opened:
            s.close()


OWNERS = [OwnerId(f"host-{i}", 100 + i, f"nonce-{i}") for i in range(CONTENDERS)]


def test_stores_racing_one_claim_admit_exactly_one(store, stores) -> None:
    """RS-09 as a race between stores: one ``Claimed``; every other ``AlreadyClaimed`` or
    ``SnapshotChanged``; the row's claimant is the winner and the run has one claimed fact."""
    for k in range(ROUNDS):
        rid = f"claim-{k}"
        store.runs.create(rid, "{}")
        got = _race(stores, [lambda s, o=o, rid=rid: s.runs.claim(rid, PENDING, o, 0) for o in OWNERS])
        winners = [OWNERS[i] for i, r in enumerate(got) if r == Claimed(0)]
        assert len(winners) == 1, got
        assert all(isinstance(r, (AlreadyClaimed, SnapshotChanged)) for r in got if r != Claimed(0)), got
        assert store.runs.get(rid).claimant == winners[0]
        assert facts(store, rid) == [("claimed", winners[0], 0)]


def test_stores_racing_cancel_requests_have_one_writer(store, stores) -> None:
    """RM-17 as a race between stores: requests at 500, 900, 700, 300 on one run: exactly one
    ``CancelRequested{w}``, every other ``AlreadyRequested{w}``, and the column holds w."""
    times = [500, 900, 700, 300]
    for k in range(ROUNDS):
        rid = f"cancel-{k}"
        store.runs.create(rid, "{}")
        got = _race(stores, [lambda s, t=t, rid=rid: s.runs.request_cancel(rid, t) for t in times])
        winners = [r for r in got if isinstance(r, CancelRequested)]
        assert len(winners) == 1, got
        w = winners[0].requested_at_ms
        assert sorted(got, key=repr) == sorted([CancelRequested(w)] + [AlreadyRequested(w)] * 3, key=repr)
        assert store.runs.get(rid).cancel_requested_at_ms == w


def test_stores_racing_to_steal_one_stale_run_reserve_it_once(store, stores, clock) -> None:
    """Steal as a race: A's run is stale (31 s); four claimants on other hosts steal it with valid
    evidence at once: exactly one ``Claimed{now}``, the others ``AlreadyClaimed`` or
    ``SnapshotChanged``; the row stays A's (running) with the winner's claim, one stolen fact."""
    for k in range(ROUNDS):
        rid, t0 = f"steal-{k}", k * 100_000
        clock.set(t0)
        store.runs.create(rid, "{}")
        store.runs.claim_and_own(rid, PENDING, A, t0)
        now = t0 + 31_000
        clock.set(now)
        got = _race(stores, [lambda s, o=o, rid=rid, t0=t0, now=now: s.runs.steal(rid, running(A, t0), o, now,
                                                                                  ev(A, o, now))
                             for o in OWNERS])
        winners = [OWNERS[i] for i, r in enumerate(got) if r == Claimed(now)]
        assert len(winners) == 1, got
        assert all(isinstance(r, (AlreadyClaimed, SnapshotChanged)) for r in got if r != Claimed(now)), got
        row = store.runs.get(rid)
        assert (row.status, row.owner, row.claimant, row.claimed_at_ms) == ("running", A, winners[0], now)
        stolen = [f for f in facts(store, rid) if f[0] == "stolen"]
        assert stolen == [("stolen", winners[0], now)]


def test_a_cancel_request_racing_the_owners_completion_agrees_with_the_row(store, stores) -> None:
    """A cancel request and the owner's completion race from two stores: either the request lands
    first (``CancelRequested{700}``: the completed row keeps 700) or the completion does
    (``Terminal{completed}``: the column stays null). Never both, never neither."""
    seen = set()
    for k in range(ROUNDS * 2):
        rid = f"settle-{k}"
        store.runs.create(rid, "{}")
        store.runs.claim_and_own(rid, PENDING, A, 0)
        cancel, settle = _race(stores[:2], [lambda s, rid=rid: s.runs.request_cancel(rid, 700),
                                            lambda s, rid=rid: s.runs.transition_owned(rid, A, "completed")])
        assert settle == Transitioned(), settle
        row = store.runs.get(rid)
        assert row.status == "completed"
        if cancel == CancelRequested(700):
            assert row.cancel_requested_at_ms == 700
        else:
            assert cancel == Terminal("completed"), cancel
            assert row.cancel_requested_at_ms is None
        seen.add(type(cancel).__name__)
    assert seen  # which orders occurred is up to the scheduler; each one checked above
