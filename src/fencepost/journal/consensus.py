"""Consensus strategies: who may own a run (line A, REFERENCE 3.3).

The run store asks the strategy inside the same serialized write transaction as the run-row
mutation and mirrors its decision onto the row; the journal asks ``guard`` before a fenced append.
One instance is shared by both, so they always agree on who holds a run.
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import select
from sqlalchemy.engine import Connection

from fencepost._schema import flows_consensus_leases as leases
from fencepost.journal.owner import OwnerId


class Consensus(Protocol):
    def guard(self, conn: Connection, run_id: str, owner: OwnerId) -> bool:
        """True when ``owner`` (the whole triple) holds ``run_id`` right now, in ``conn``'s transaction."""
        ...


class SqlConsensus:
    """The database-backed strategy whose lease lives in ``flows_consensus_leases``."""

    def guard(self, conn: Connection, run_id: str, owner: OwnerId) -> bool:
        row = conn.execute(
            select(leases.c.run_id).where(
                leases.c.run_id == run_id,
                leases.c.owner_host_id == owner.host_id,
                leases.c.owner_pid == owner.pid,
                leases.c.owner_nonce == owner.nonce,
            )
        ).first()
        return row is not None
