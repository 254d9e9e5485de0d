"""Benchmark: the run-store hot path against the raw driver executing the same SQL.

Per run: ``claim_and_own``, 3 x ``heartbeat``, ``transition_owned(..., "completed")``, each its own
write transaction (5 transactions, 3 journal facts). The baseline runs the *same statement texts*
(our compiled statements, the journal's head lookup and insert per fact, the same entry hashing) through
the raw driver (``sqlite3`` / ``psycopg``) on an identically migrated database, with the same
transaction boundaries (SQLite ``BEGIN IMMEDIATE``; PostgreSQL the per-schema advisory lock).
Reps are interleaved (ours, raw, ours, raw, ...) and the median of the per-rep ratios is printed.
Nothing is asserted: timing is for reading, not for CI.

Also timed (no baseline): one ``heartbeat_many`` renewing ``--many`` runs (10 000 by default).

Usage::

    .venv/bin/python bench/runstore.py [--runs 200] [--reps 7] [--many 10000] \
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

import fencepost
from _pg import ScratchSchemas  # bench/ is sys.path[0] when run as a script
from fencepost import OwnerId, RunSnapshot
from fencepost._values import encode_json
from fencepost.clock import ManualClock
from fencepost.journal import _append, companion_stream
from fencepost.journal import _sql as jsql
from fencepost.journal import consensus as cs
from fencepost.runstore import _sql as q

OWNER = OwnerId("bench-host", 4242, "bench-nonce")
PENDING = RunSnapshot("pending", None, None)

# The journal's statements for one fact (what Journal.append_in executes): the head lookup and the insert.
J_HEADS, J_INSERT = jsql.HEADS, jsql.INSERT


class Raw:
    """The hot path through the raw driver: same statements, same transactions."""

    def __init__(self, kind: str, conn: Any, schema: str | None = None) -> None:
        self.kind = kind
        self.conn = conn
        self.schema = schema
        self.heads, self.head_defaults = J_HEADS.compiled(kind)
        # The store passes the insert's values as a tuple in ``INSERT_FIELDS`` order, bound as it is
        # on SQLite (named on PostgreSQL): so does this loop.
        self.insert, _, order = J_INSERT.plan(kind)
        self.insert_params = order or (lambda values: values)

    def sql(self, stmt: Any) -> str:
        return stmt.compiled(self.kind)[0]

    def begin(self) -> None:
        if self.kind == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%(s)s, 2099))", {"s": self.schema})

    def commit(self) -> None:
        self.conn.commit() if self.kind != "sqlite" else self.conn.execute("COMMIT")

    def fact(self, run_id: str, kind: str, granted: int | None, now: int) -> None:
        c = self.conn
        stream = companion_stream(run_id)
        payload = encode_json({"runId": run_id, "owner": OWNER.to_json(), "grantedAtMs": granted})
        meta = encode_json({"runId": run_id})
        etype = f"flows.consensus.{kind}"
        last_seq, stream_prev, last_pos, log_prev, last_source = c.execute(
            self.heads, {**self.head_defaults, "run_id": stream, "source_id": "flows.run-store"}).fetchone()
        source_seq = 0 if last_source is None else last_source + 1
        row = {
            "run_id": stream, "seq": 0 if last_seq is None else last_seq + 1,
            "event_id": _append.event_id_for(stream, "flows.run-store", source_seq), "source_id": "flows.run-store",
            "source_seq": source_seq, "emitted_at_ms": now, "event_type": etype, "payload_json": payload,
            "meta_json": meta, "content_hash": _append.content_hash(etype, payload, meta),
            "position": 1 if last_pos is None else last_pos + 1,
            "stream_prev_hash": stream_prev or _append.ZERO_HASH,
            "log_prev_hash": log_prev or _append.ZERO_HASH,
        }
        row["entry_hash"] = _append.entry_hash(row)
        c.execute(self.insert, self.insert_params(tuple(row[f] for f in jsql.INSERT_FIELDS)))

    def one_run(self, run_id: str, now: int) -> None:
        c, o = self.conn, {"o_host": OWNER.host_id, "o_pid": OWNER.pid, "o_nonce": OWNER.nonce}
        cl = {"c_host": OWNER.host_id, "c_pid": OWNER.pid, "c_nonce": OWNER.nonce}
        # claim_and_own
        self.begin()
        c.execute(self.sql(q.SELECT_GUARDED), {"run_id": run_id}).fetchone()
        c.execute(self.sql(cs.CLAIM), {"run_id": run_id, "now": now, **cl}).fetchone()
        c.execute(self.sql(cs.ACTIVATE), {"run_id": run_id, "granted": now, "now": now, **cl}).fetchone()
        self.fact(run_id, "claimed", now, now)
        self.fact(run_id, "activated", now, now)
        c.execute(self.sql(q.SET_RUNNING), {"run_id": run_id, "started": now, "hb": now, **o})
        self.commit()
        # 3 x heartbeat
        for i in range(1, 4):
            self.begin()
            hb = c.execute(self.sql(cs.HEARTBEAT), {"run_id": run_id, "now": now + i, **o}).fetchone()[0]
            c.execute(self.sql(q.HEARTBEAT_RUN), {"run_id": run_id, "hb": hb, **o}).fetchone()
            self.commit()
        # transition_owned -> completed
        self.begin()
        c.execute(self.sql(cs.GUARD), {"run_id": run_id, **o}).fetchone()
        c.execute(self.sql(q.SELECT_GUARDED), {"run_id": run_id}).fetchone()  # the claim a settle drops
        c.execute(self.sql(q.TRANSITION_SETTLE), {"run_id": run_id, "state_json": '{"done":true}', "guard": 0,
                                                  "failure_json": None,
                                                  "to": "completed", "finished": now, **o}).fetchone()
        c.execute(self.sql(cs.RELEASE_OWNER), {"run_id": run_id, **o}).fetchone()
        self.fact(run_id, "released", None, now)
        self.commit()


def ours_one_run(store: fencepost.Store, run_id: str, now: int) -> None:
    runs = store.runs
    assert runs.claim_and_own(run_id, PENDING, OWNER, now).__class__.__name__ == "Activated"
    for i in range(1, 4):
        runs.heartbeat(run_id, OWNER, now + i)
    runs.transition_owned(run_id, OWNER, "completed", '{"done":true}')


def seed(store: fencepost.Store, prefix: str, n: int) -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(n)]
    for rid in ids:
        store.runs.create(rid, "{}")
    return ids


def bench_backend(label: str, ours_url: str, raw_url: str, raw_connect: Any, kind: str, runs: int, reps: int,
                  schema: str | None) -> None:
    clock = ManualClock(0)
    ours = fencepost.open(ours_url, clock=clock)
    raw_store = fencepost.open(raw_url, clock=clock)  # migrated identically; rows created through the API
    raw = Raw(kind, raw_connect(), schema)
    ratios, ours_rates, raw_rates = [], [], []
    for rep in range(reps):
        ids_a = seed(ours, f"o{rep}", runs)
        ids_b = seed(raw_store, f"r{rep}", runs)
        t0 = time.perf_counter()
        for rid in ids_a:
            ours_one_run(ours, rid, 0)
        t1 = time.perf_counter()
        for rid in ids_b:
            raw.one_run(rid, 0)
        t2 = time.perf_counter()
        ours_rate, raw_rate = runs / (t1 - t0), runs / (t2 - t1)
        ours_rates.append(ours_rate)
        raw_rates.append(raw_rate)
        ratios.append(ours_rate / raw_rate)
    print(f"{label:28s} ours {statistics.median(ours_rates):8.0f} runs/s  raw {statistics.median(raw_rates):8.0f} "
          f"runs/s  median ratio {statistics.median(ratios):.2f}x  (ratios {' '.join(f'{r:.2f}' for r in ratios)})")
    ours.close()
    raw_store.close()
    raw.conn.close()


def bench_heartbeat_many(label: str, url: str, n: int, reps: int) -> None:
    """``heartbeat_many`` over ``n`` owned runs (rows and leases seeded in bulk), one write transaction each."""
    from fencepost._schema import flows_consensus_leases, flows_runs

    store = fencepost.open(url, clock=ManualClock(0))
    ids = [f"hb-{i}" for i in range(n)]
    owned = {"owner_host_id": OWNER.host_id, "owner_pid": OWNER.pid, "owner_nonce": OWNER.nonce}
    with store.db.connect() as conn:
        conn.execute(flows_runs.insert(), [{"run_id": r, "status": "running", "state_json": "{}", "created_at_ms": 0,
                                            "heartbeat_at_ms": 0, **owned} for r in ids])
        conn.execute(flows_consensus_leases.insert(), [{"run_id": r, "granted_at_ms": 0, "heartbeat_at_ms": 0, **owned}
                                                       for r in ids])
        conn.commit()
    times = []
    for rep in range(reps):
        t0 = time.perf_counter()
        got = store.runs.heartbeat_many(OWNER, ids, rep + 1)
        times.append(time.perf_counter() - t0)
        assert len(got) == n
    print(f"{label:28s} heartbeat_many({n} runs): median {1000 * statistics.median(times):.0f} ms per call "
          f"({' '.join(f'{1000 * t:.0f}' for t in times)} ms)")
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--pg", default=os.environ.get("FENCEPOST_TEST_POSTGRES_URL"))
    ap.add_argument("--many", type=int, default=10_000, help="runs renewed per heartbeat_many call")
    args = ap.parse_args()
    print(f"hot path per run: claim_and_own + 3 heartbeat + transition_owned(completed) = 5 write transactions; "
          f"{args.runs} runs x {args.reps} interleaved reps")
    with tempfile.TemporaryDirectory() as tmp:
        for sync in ("FULL", "NORMAL"):
            a, b = os.path.join(tmp, f"ours-{sync}.db"), os.path.join(tmp, f"raw-{sync}.db")

            def connect(path: str = b, sync: str = sync) -> sqlite3.Connection:
                c = sqlite3.connect(path, isolation_level=None)
                c.execute("PRAGMA busy_timeout = 10000")
                c.execute("PRAGMA foreign_keys = ON")
                c.execute(f"PRAGMA synchronous = {sync}")
                return c

            bench_backend(f"sqlite synchronous={sync}", f"sqlite:///{a}?synchronous={sync}", f"sqlite:///{b}",
                          connect, "sqlite", args.runs, args.reps, None)
            bench_heartbeat_many(f"sqlite synchronous={sync}", f"sqlite:///{tmp}/many-{sync}.db?synchronous={sync}",
                                 args.many, 5)
    if args.pg:
        with ScratchSchemas(args.pg) as pg:
            _, ours = pg.new()
            raw_schema, raw = pg.new()
            bench_backend("postgresql", ours, raw, lambda: pg.connect(raw_schema), "postgresql", args.runs,
                          args.reps, raw_schema)
            _, many = pg.new()
            bench_heartbeat_many("postgresql", many, args.many, 5)


if __name__ == "__main__":
    main()
