"""Benchmark: how many running runs one process keeps alive with one ``heartbeat_many`` per interval.

A worker renews every lease it holds with ``runs.heartbeat_many(owner, run_ids, now_ms)``: one write
transaction per ``HEARTBEAT_INTERVAL`` (1 s), whatever the number of runs. This measures the time of
that one call for N running runs on SQLite and PostgreSQL and derives the capacity: the number of
runs whose leases one process can renew within one interval (N x interval / time, linear in N).

Baseline: the raw driver (``sqlite3`` / ``psycopg``) executing the same two UPDATE statements (the
consensus lease renewal and the run-row mirror, our compiled texts) in one transaction with the same
writer lock, on an identically prepared database. Reps alternate (ours, raw, ...); medians are
printed with the ratio. Nothing is asserted: timing is for reading, not for CI.

Usage::

    .venv/bin/python bench/heartbeats.py [--runs 10000] [--reps 5] [--only sqlite|postgresql]
        [--pg postgresql+psycopg://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from typing import Any

import msgspec

import fencepost
from _pg import ScratchSchemas  # bench/ is sys.path[0] when run as a script
from fencepost import OwnerId, RunSnapshot
from fencepost.clock import ManualClock
from fencepost.journal import consensus as cs
from fencepost.runstore import _sql as q
from fencepost.runstore.heartbeat import HEARTBEAT_INTERVAL

OWNER = OwnerId("bench-host", 4242, "bench-nonce")
PENDING = RunSnapshot("pending", None, None)
INTERVAL_S = HEARTBEAT_INTERVAL.total_seconds()


def populate(store: fencepost.Store, prefix: str, n: int, batch: int = 1000) -> list[str]:
    """Create ``n`` runs owned by OWNER (running, fresh lease), ``batch`` per write transaction."""
    ids = [f"{prefix}-{i:06d}" for i in range(n)]
    now = store.clock.now_ms()

    def chunk(part: list[str]) -> None:
        for rid in part:
            store.runs.create(rid, "{}")
            outcome = store.runs.claim_and_own(rid, PENDING, OWNER, now)
            assert type(outcome).__name__ == "Activated", outcome

    for i in range(0, n, batch):
        part = ids[i:i + batch]
        store.db.write(lambda conn, part=part: chunk(part))  # nested writes join as savepoints
    return ids


class Raw:
    """The same two UPDATEs through the raw driver, in one transaction under the same writer lock."""

    def __init__(self, kind: str, conn: Any, schema: str | None) -> None:
        self.kind, self.conn, self.schema = kind, conn, schema
        self.lease = cs.HEARTBEAT_MANY.compiled(kind)
        self.rows = q.HEARTBEAT_MANY_RUNS.compiled(kind)

    def heartbeat_many(self, ids: list[str], now: int) -> int:
        c = self.conn
        o = {"o_host": OWNER.host_id, "o_pid": OWNER.pid, "o_nonce": OWNER.nonce}
        ids_json = msgspec.json.encode(ids).decode()
        if self.kind == "sqlite":
            c.execute("BEGIN IMMEDIATE")
        else:
            c.execute("SELECT pg_advisory_xact_lock(hashtextextended(%(s)s, 2099))", {"s": self.schema})
        renewed = c.execute(self.lease[0], {**self.lease[1], **o, "ids": ids_json, "now": now}).fetchall()
        mirrored = c.execute(self.rows[0], {**self.rows[1], **o, "ids": ids_json, "hb": now}).fetchall()
        c.execute("COMMIT") if self.kind == "sqlite" else c.commit()
        assert len(renewed) == len(mirrored) == len(ids)
        return len(mirrored)


def bench_backend(label: str, ours_url: str, raw_url: str, raw_connect: Any, kind: str, n: int, reps: int,
                  schema: str | None) -> None:
    clock = ManualClock(1_000_000)
    ours = fencepost.open(ours_url, clock=clock)
    raw_store = fencepost.open(raw_url, clock=clock)
    t0 = time.perf_counter()
    ids_a = populate(ours, "o", n)
    ids_b = populate(raw_store, "r", n)
    print(f"{label}: prepared 2 x {n} running runs in {time.perf_counter() - t0:.1f} s")
    raw = Raw(kind, raw_connect(), schema)
    ours_t, raw_t, ratios = [], [], []
    for _ in range(reps):
        now = clock.advance(1000)
        t1 = time.perf_counter()
        answers = ours.runs.heartbeat_many(OWNER, ids_a, now)
        t2 = time.perf_counter()
        raw.heartbeat_many(ids_b, now)
        t3 = time.perf_counter()
        assert len(answers) == n and all(type(a).__name__ == "Updated" for a in answers.values())
        ours_t.append(t2 - t1)
        raw_t.append(t3 - t2)
        ratios.append((t2 - t1) / (t3 - t2))
    mo, mr = statistics.median(ours_t), statistics.median(raw_t)
    print(f"  heartbeat_many({n}): ours {mo * 1000:8.1f} ms   raw {mr * 1000:8.1f} ms   "
          f"median time ratio {statistics.median(ratios):.2f}x")
    print(f"  capacity per {INTERVAL_S:g} s interval: ours ~{int(n * INTERVAL_S / mo):,} runs   "
          f"raw ~{int(n * INTERVAL_S / mr):,} runs   ({'within' if mo < INTERVAL_S else 'OVER'} one interval "
          f"at {n:,}, using {100 * mo / INTERVAL_S:.0f}% of it)")
    ours.close()
    raw_store.close()
    raw.conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pg", default=os.environ.get("FENCEPOST_TEST_POSTGRES_URL"))
    ap.add_argument("--only", choices=["sqlite", "postgresql"], default=None, help="Run one backend only.")
    args = ap.parse_args()
    print(f"one heartbeat_many per interval for {args.runs:,} running runs, {args.reps} alternating reps")
    with tempfile.TemporaryDirectory() as tmp:
        a, b = os.path.join(tmp, "ours.db"), os.path.join(tmp, "raw.db")

        def connect() -> sqlite3.Connection:
            c = sqlite3.connect(b, isolation_level=None)
            c.execute("PRAGMA busy_timeout = 10000")
            return c

        if args.only != "postgresql":
            bench_backend("sqlite", f"sqlite:///{a}", f"sqlite:///{b}", connect, "sqlite", args.runs, args.reps, None)
    if args.pg and args.only != "sqlite":
        with ScratchSchemas(args.pg) as pg:
            _, ours = pg.new()
            raw_schema, raw = pg.new()
            bench_backend("postgresql", ours, raw, lambda: pg.connect(raw_schema), "postgresql", args.runs,
                          args.reps, raw_schema)


if __name__ == "__main__":
    main()
