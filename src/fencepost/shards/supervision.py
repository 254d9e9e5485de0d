"""Supervision over a shard set: one ``Supervisor`` per member, so each shard is pulsed on its own.

A ``Supervisor`` given a ``ShardSet`` renews every lease it holds with one sharded
``heartbeat_many`` per interval, which answers once every shard did: a shard whose write lock is
held makes each pulse wait for the store's whole busy timeout, and the runs of the healthy shards
wait with it (their leases are then reconfirmed, or lapse when the lock is held for ever).
``ShardSupervisor`` holds each run under the supervisor of the member that holds it, so a blocked
shard delays only its own runs' heartbeats; a ``Worker`` over a shard set supervises with one.
"""

from __future__ import annotations

from typing import Any

from fencepost.journal.owner import OwnerId
from fencepost.runstore import _checks as check
from fencepost.runstore.ownership import Lease, Supervisor

__all__ = ["ShardSupervisor"]


class ShardSupervisor:
    """``Supervisor``'s calls over a shard set, one member ``Supervisor`` (and loop thread) per shard.

    ``hold(run_id, ...)`` holds the run under its shard's supervisor (the shard is found as every
    routed call finds it) and returns that ``Lease``; ``held()``, ``settle()``, ``pulses`` and
    ``failed_pulses`` cover every shard. Each member's loop starts with its first lease, so a shard
    none of whose runs is held costs no thread. ``supervisors`` maps shard name to its supervisor.
    """

    def __init__(self, shards: Any, owner: OwnerId, *, clock: Any = None, journal_reconfirm: bool = True) -> None:
        check.owner(owner, "Supervisor")
        self.store = shards
        self.owner = owner
        self.clock = clock if clock is not None else shards.clock
        self.journal_reconfirm = journal_reconfirm
        self.supervisors: dict[str, Supervisor] = {
            name: Supervisor(store, owner, clock=self.clock, journal_reconfirm=journal_reconfirm)
            for name, store in shards.items()}

    def start(self) -> ShardSupervisor:
        """Start the loop of every shard holding a lease (idempotent); the others start with their first."""
        for sup in self.supervisors.values():
            if sup.held():
                sup.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop pulsing on every shard; held leases simply stop being renewed."""
        for sup in self.supervisors.values():
            sup.stop(timeout)

    def __enter__(self) -> ShardSupervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def hold(self, run_id: str, **kwargs: Any) -> Lease:
        """``Supervisor.hold`` on the shard holding ``run_id`` (same arguments, outcomes and errors)."""
        return self.supervisors[self.store._route(run_id)].hold(run_id, **kwargs)

    def held(self) -> list[str]:
        """The run ids currently supervised and not lost, on every shard."""
        return [r for sup in self.supervisors.values() for r in sup.held()]

    def settle(self, timeout: float = 5.0) -> None:
        """``Supervisor.settle`` on every shard (for tests driving a ``ManualClock``)."""
        for sup in self.supervisors.values():
            sup.settle(timeout)

    @property
    def pulses(self) -> int:
        return sum(sup.pulses for sup in self.supervisors.values())

    @property
    def failed_pulses(self) -> int:
        return sum(sup.failed_pulses for sup in self.supervisors.values())
