"""A RunsByStatus that also logs every application into a table outside the shadow mechanism.

The log is written in the same target transaction as the update and its checkpoint, so a row in
it is exactly one committed application; a duplicate ``(run_id, source, revision)`` would be a
change applied twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text

from fencepost.projections import RunsByStatus, Target

log_metadata = MetaData()
applications = Table(
    "test_projection_applications",
    log_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("revision", BigInteger().with_variant(Integer(), "sqlite"), nullable=False),
    Column("shadow", Integer, nullable=False),
)


class CountingRunsByStatus(RunsByStatus):
    def __init__(self) -> None:
        super().__init__("counting_runs", table="test_counting_runs")

    def apply_batch(self, target: Target, updates: Sequence[Any]) -> None:
        super().apply_batch(target, updates)
        target.conn.execute(applications.insert(), [
            {"run_id": u.run_id, "source": u.source, "revision": u.revision, "shadow": int(target.shadow)}
            for u in updates
        ])
