"""What the worker does with runs it finds, observed in the store: who it probes, what it leaves
alone, what it takes over, and what a lost race leaves behind. The Python analogues of upstream's
driver-level observation (UPSTREAM-TESTS C5, EO-*); the worker is our driver. Every test runs on
SQLite and PostgreSQL; time is a ``ManualClock``."""

from __future__ import annotations

import threading

import msgspec

from fencepost.journal import companion_stream
from fencepost.journal.owner import OwnerId
from fencepost.runstore.liveness import lease_liveness
from fencepost.worker import RunContext, Suspend, Worker
from tests.worker.conftest import facts, own

ME = OwnerId("host-w", 4242, "worker")
FOREIGN = OwnerId("host-f", 777, "foreign")




class Probe:
    """A liveness check that records every call, answering as ``lease_liveness()`` does."""

    def __init__(self) -> None:
        self.calls: list[OwnerId] = []
        self.real = lease_liveness()

    def __call__(self, owner, context) -> bool:
        self.calls.append(owner)
        return self.real(owner, context)


def test_a_fresh_run_the_worker_itself_owns_is_left_as_it_is(store, clock):
    """EO-01: a running run this worker's own owner holds with a fresh heartbeat is routine: no
    liveness probe, no execution, the row unchanged (running, owner, heartbeat 0), no new fact."""
    store.runs.create("r", "{}")
    own(store, "r", ME)
    before = store.runs.get("r")
    clock.set(10_000)
    probe, ran = Probe(), []
    worker = Worker(store, lambda ctx: ran.append(ctx.run_id), owner=ME, liveness=probe)
    assert worker.take(5) == []
    assert (probe.calls, ran) == ([], [])
    after = store.runs.get("r")
    assert after == before and (after.status, after.owner, after.heartbeat_at_ms) == ("running", ME, 0)
    assert facts(store, "r") == ["claimed", "activated"]


def test_a_run_outside_the_workers_prefix_is_refused_before_any_ownership(store):
    """EO-02 (analogue: a worker only executes runs under its ``run_prefix``): a run another worker
    must execute stays pending, with no owner, no claim and no fact."""
    store.runs.create("theirs-1", "{}")
    ran: list[str] = []
    worker = Worker(store, lambda ctx: ran.append(ctx.run_id), run_prefix="mine-")
    assert worker.take(5) == []
    stats = worker.run(until_idle=True)
    row = store.runs.get("theirs-1")
    assert (ran, stats.claimed) == ([], 0)
    assert (row.status, row.owner, row.claimant, row.claimed_at_ms) == ("pending", None, None, None)
    assert facts(store, "theirs-1") == []


def test_a_fresh_foreign_owner_is_not_probed_and_a_stale_one_is_probed_once_then_stolen(store, clock):
    """EO-04: a run a foreign owner holds with a fresh heartbeat is neither probed nor stolen.
    EO-05: after 31 s the probe runs once, for that owner; the run is stolen and completed, owner
    and heartbeat cleared."""
    store.runs.create("r", "{}")
    own(store, "r", FOREIGN)
    probe, ran = Probe(), []

    def fn(ctx: RunContext):
        ran.append(ctx.run_id)
        return {"done": True}

    worker = Worker(store, fn, owner=ME, liveness=probe)
    clock.set(1_000)
    assert worker.take(5) == []
    assert probe.calls == [] and store.runs.get("r").owner == FOREIGN
    clock.set(31_000)
    stats = worker.run(until_idle=True)
    assert probe.calls == [FOREIGN] and ran == ["r"] and stats.takeovers == 1
    row = store.runs.get("r")
    assert (row.status, row.owner, row.heartbeat_at_ms) == ("completed", None, None)
    assert facts(store, "r") == ["claimed", "activated", "stolen", "activated", "released"]


def test_an_old_owner_heartbeating_between_steal_and_activation_keeps_its_run(store, clock):
    """EO-06: the worker stole the claim of an expired run, and the old owner heartbeats before the
    worker activates: the function never starts, the worker's claim is released exactly once (our
    ``activate`` answers ``SnapshotChanged`` and releases the claim itself, where upstream's driver
    called ``abandonClaim``), and the run stays the old owner's with no claim left."""
    store.runs.create("r", "{}")
    own(store, "r", FOREIGN)
    clock.set(31_000)
    runs = store.runs
    real_activate = runs.activate
    answers: list[str] = []

    def activate(run_id, owner, claimed_at_ms, expected):
        assert type(runs.heartbeat(run_id, FOREIGN, clock.now_ms())).__name__ == "Updated"
        outcome = real_activate(run_id, owner, claimed_at_ms, expected)
        answers.append(type(outcome).__name__)
        return outcome

    runs.activate = activate
    ran: list[str] = []
    worker = Worker(store, lambda ctx: ran.append(ctx.run_id), owner=ME)
    try:
        assert worker.take(5) == []
    finally:
        runs.activate = real_activate
    row = store.runs.get("r")
    assert ran == [] and answers == ["SnapshotChanged"]
    assert (row.status, row.owner, row.claimant, row.claimed_at_ms) == ("running", FOREIGN, None, None)
    assert row.heartbeat_at_ms == 31_000
    entries = store.journal.entries(companion_stream("r")).entries
    assert [e.event_type.rsplit(".", 1)[-1] for e in entries] == ["claimed", "activated", "stolen", "released"]
    assert entries[-1].payload["owner"]["nonce"] == ME.nonce
    assert type(runs.heartbeat("r", FOREIGN, 32_000)).__name__ == "Updated"  # still the old owner's


def test_suspension_clears_owner_heartbeat_and_claim(store):
    """EO-07: a run its function suspends is parked with no owner, no heartbeat and no claim, its
    state the one given, its lease released."""
    store.runs.create("r", "{}")
    stop = threading.Event()

    def fn(ctx: RunContext):
        stop.set()  # nothing new is taken: the suspended run stays parked
        raise Suspend({"parked": 1})

    Worker(store, fn, owner=ME).run(stop)
    row = store.runs.get("r")
    assert (row.status, row.owner, row.heartbeat_at_ms, row.claimant, row.claimed_at_ms) == \
        ("suspended", None, None, None, None)
    assert msgspec.json.decode(row.state_json) == {"parked": 1}
    assert row.cancel_requested_at_ms is None
    assert facts(store, "r") == ["claimed", "activated", "released"]
