"""Helpers for projections fed by several stores: two SQLite files and one PostgreSQL schema."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text, text

import fencepost
from fencepost.projections import RunsByStatus, Target
from tests.projections import _runs

KINDS = {"edge-1": "sqlite", "edge-2": "sqlite", "central": "postgresql"}

log_metadata = MetaData()
share_applications = Table(
    "test_share_applications",
    log_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("source_name", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("revision", BigInteger().with_variant(Integer(), "sqlite"), nullable=False),
    Column("shadow", Integer, nullable=False),
)


class CountingShares(RunsByStatus):
    """``RunsByStatus`` keyed by source name that also logs each application, in the same transaction."""

    def __init__(self) -> None:
        super().__init__("counting_shares", table="test_counting_shares", by_source=True)

    def apply_batch(self, target: Target, updates: Sequence[Any]) -> None:
        super().apply_batch(target, updates)
        target.conn.execute(share_applications.insert(), [
            {"source_name": target.source_name, "run_id": u.run_id, "source": u.source, "revision": u.revision,
             "shadow": int(target.shadow)}
            for u in updates
        ])


def open_sources(make_db_url) -> tuple[dict[str, str], dict[str, fencepost.Store]]:
    """Three fresh stores (URLs and opened stores), named as in ``KINDS``."""
    urls = {name: make_db_url(kind) for name, kind in KINDS.items()}
    return urls, {name: fencepost.open(url) for name, url in urls.items()}


def seed(store: fencepost.Store, ids: list[str], prefix: str, count: int, t: int = 0) -> None:
    """Create ``count`` runs ``<prefix>-NNNN`` (the same ids in every store: ids are per store)."""

    def body(conn: Any) -> None:
        for i in range(count):
            _runs.create(conn, f"{prefix}-{i:04d}", t + i)
            ids.append(f"{prefix}-{i:04d}")

    store.db.write(body)


class Writers:
    """One thread per store applying random raw mutations until stopped; counts them per store."""

    def __init__(self, stores: dict[str, fencepost.Store], ids: dict[str, list[str]], pause: float = 0.01) -> None:
        self.stop = threading.Event()
        self.counts = dict.fromkeys(stores, 0)
        self._threads = [
            threading.Thread(target=self._write, args=(name, store, ids[name], pause), name=f"writer-{name}")
            for name, store in stores.items()
        ]

    def _write(self, name: str, store: fencepost.Store, ids: list[str], pause: float) -> None:
        rng = random.Random(name)
        t = 10_000
        while not self.stop.is_set():
            t += 1
            store.db.write(lambda conn, t=t: _runs.random_mutation(conn, rng, ids, "w", t))
            self.counts[name] += 1
            time.sleep(pause)

    def __enter__(self) -> Writers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join()


_COLUMNS = ("status, flow_name, owner_host_id, owner_pid, owner_nonce, created_at_ms, started_at_ms, finished_at_ms, "
            "cancel_requested_at_ms, cancel_acknowledged_at_ms, source, revision")


def rows_by_source(db: Any, table: str) -> dict[str, dict[str, tuple]]:
    """``{source_name: {run_id: row}}`` of a projection table keyed by source."""

    def body(conn: Any) -> dict[str, dict[str, tuple]]:
        out: dict[str, dict[str, tuple]] = {}
        for r in conn.execute(text(f"SELECT source_name, run_id, {_COLUMNS} FROM {table}")):
            out.setdefault(r[0], {})[r[1]] = tuple(r[2:])
        return out

    return db.read(body)


def projected_by_source(db: Any, table: str, names: Sequence[str]) -> dict[str, dict[str, tuple]]:
    """What the table holds for each source, in ``_runs.live_rows`` shape (every name present)."""
    projected: dict[str, dict[str, tuple]] = {name: {} for name in names}

    def body(conn: Any) -> None:
        for r in conn.execute(text(
            "SELECT source_name, run_id, status, owner_host_id, owner_pid, owner_nonce, created_at_ms, "
            f"started_at_ms, finished_at_ms, cancel_requested_at_ms FROM {table}"
        )):
            projected.setdefault(r[0], {})[r[1]] = tuple(r[2:])

    db.read(body)
    return projected


def store_rows(stores: dict[str, fencepost.Store]) -> dict[str, dict[str, tuple]]:
    """Each store's live runs (``_runs.live_rows``), by source name; empty stores included."""
    return {name: store.db.read(_runs.live_rows) for name, store in stores.items()}
