"""``Worker.take()`` hands over, with each run, when it was activated, so a caller holding the run
later counts its lease from the activation, as the store does.

Defect: ``take()`` returned bare rows. A caller who held them afterwards (the documented take-then-
hold pattern) could only count the lease from its own hold; the store counts the run's lease from the
heartbeat the activation stored, so with a delay between take and hold the caller's lease outlasted
the stored one by that delay, and it kept running the run after a peer was allowed to take it over.
Both backends; time is a ``ManualClock``, so the delay is a clock step, not a wait.
"""

from __future__ import annotations

from fencepost.runstore.heartbeat import STALE_AFTER_MS
from fencepost.runstore.heartbeat import WRITE_TOLERANCE_MS as TOLERANCE_MS
from fencepost.runstore.rows import RunRow
from fencepost.worker import Worker

DELAY_MS = 12_000  # between take and hold: a slow caller, well inside the stored lease


def test_a_run_held_after_take_counts_its_lease_from_the_activation(store, clock):
    store.runs.create("r1", "{}")
    clock.set(5_000)
    worker = Worker(store, lambda ctx: None)
    try:
        (row,) = worker.take(1)
        # Backward compatible: still a RunRow, with the activation time beside its fields.
        assert isinstance(row, RunRow)
        assert row.status == "running" and row.owner == worker.owner
        since = getattr(row, "lease_since_ms", None)  # the documented take-then-hold pattern

        clock.advance(DELAY_MS)  # the caller holds the run later
        lease = worker.supervisor.hold(row.run_id, since_ms=since)
        # The lease ends where the stored one lets it, not DELAY_MS later.
        assert lease.confirmed_ms == 5_000 <= row.heartbeat_at_ms
        assert lease.deadline_ms <= row.heartbeat_at_ms + TOLERANCE_MS
        # And always before a peer may take the run over (its heartbeat STALE_AFTER old).
        assert lease.deadline_ms < row.heartbeat_at_ms + STALE_AFTER_MS
        lease.release()
    finally:
        worker.supervisor.stop()


def test_rows_returned_by_take_keep_every_run_row_field(store, clock):
    """The extra field changes nothing a caller already read: every RunRow field is the stored one."""
    store.runs.create("r1", '{"n": 1}')
    clock.set(1_000)
    worker = Worker(store, lambda ctx: None)
    (row,) = worker.take(1)
    assert type(row).__name__ == "TakenRun" and row.lease_since_ms == 1_000
    stored = store.runs.get("r1")
    for field in RunRow.__struct_fields__:
        assert getattr(row, field) == getattr(stored, field), field
