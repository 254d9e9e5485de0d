"""Projection builder throughput and lag, beside a raw driver copy.

Run: ``.venv/bin/python bench/projections.py [--runs 100000] [--pg URL] [--lag-seconds 10] [--rate 500]``

1. **Rebuild rate.** A SQLite source holds ``--runs`` runs (inserted with raw SQL; the revision
   triggers fire for each). For a SQLite target and a PostgreSQL target, ``RunsByStatus`` is built
   twice: the first ``catch_up`` into an empty target, then ``rebuild()`` (shadow fill from revision
   0 plus the one-transaction swap). Both read pages of 500 changes with their snapshots (one
   query per page), check ``is_newer`` against the held revisions and write rows, held revisions
   and the checkpoint in one target transaction per page. The baseline is the floor for moving the same rows: one
   ``SELECT ... FROM flows_runs JOIN flows_run_changes`` through the source driver and one
   ``executemany`` INSERT of the same columns into a plain table on the target, in one transaction
   (no decoding, no stale checks, no checkpoints). Rates are runs/s; the ratio is ours / raw.
2. **Steady-state lag.** A writer thread makes ``--rate`` random run mutations per second (create,
   start, heartbeat, settle, cancel, delete; one write transaction each) on a source of 10 000
   runs while ``ProjectionBuilder.run()`` follows it; ``status().lag`` (revisions not yet applied)
   is sampled every 100 ms. Printed: median, p99 and max lag, in revisions and in milliseconds of
   writer time (lag / rate). SQLite -> SQLite and PostgreSQL -> PostgreSQL.

Nothing is asserted: timing is for reading, not for CI.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.projections import _runs

import fencepost
from fencepost._durable import Database
from fencepost._migrations import migrate
from fencepost.projections import ProjectionBuilder, RunsByStatus

DEFAULT_PG = os.environ.get("FENCEPOST_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

_RAW_SELECT = (
    "SELECT r.run_id, r.status, r.owner_host_id, r.owner_pid, r.owner_nonce, r.created_at_ms, r.started_at_ms, "
    "r.finished_at_ms, r.cancel_requested_at_ms, c.revision FROM flows_runs r JOIN flows_run_changes c "
    "ON c.run_id = r.run_id"
)
_RAW_TABLE = (
    "CREATE TABLE bench_raw_copy (run_id TEXT PRIMARY KEY, status TEXT NOT NULL, owner_host_id TEXT, "
    "owner_pid BIGINT, owner_nonce TEXT, created_at_ms BIGINT NOT NULL, started_at_ms BIGINT, finished_at_ms BIGINT, "
    "cancel_requested_at_ms BIGINT, revision BIGINT NOT NULL)"
)
_RAW_INSERT = "INSERT INTO bench_raw_copy VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def _schema_url(base: str) -> tuple[str, str]:
    schema = "bench_" + uuid.uuid4().hex[:12]
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}schema={schema}", schema


def _drop_schema(base: str, schema: str) -> None:
    engine = create_engine(base, poolclass=NullPool)
    with engine.connect() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.commit()
    engine.dispose()


def _populate(store: fencepost.Store, n: int) -> None:
    rng = random.Random(1)
    rows = []
    for i in range(n):
        run_id = f"run-{i:07d}"
        roll = rng.random()
        rows.append((run_id, i, roll))

    def body(conn):
        conn.exec_driver_sql(
            "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES (?, 'pending', "
            "'{\"flowName\": \"bench\"}', ?)" if store.db.name == "sqlite" else
            "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES (%s, 'pending', "
            "'{\"flowName\": \"bench\"}', %s)",
            [(r[0], r[1]) for r in rows],
        )

    store.db.write(body)
    # A realistic mix: a third running, a third settled.
    def settle(conn):
        for run_id, t, roll in rows:
            if roll < 0.33:
                _runs.start(conn, run_id, t + 1, pid=1 + t % 50)
            elif roll < 0.66:
                _runs.settle(conn, run_id, "completed", t + 2)

    store.db.write(settle)


def _raw_copy(source: Database, target: Database) -> float:
    """Seconds to move the projected columns of every run through the drivers, one transaction."""
    marker = "%s" if target.name == "postgresql" else "?"
    insert = _RAW_INSERT.replace("?", marker)
    with target.engine.connect() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS bench_raw_copy")
        conn.exec_driver_sql(_RAW_TABLE)
        conn.commit()
    started = time.perf_counter()
    with source.engine.connect() as src:
        rows = src.exec_driver_sql(_RAW_SELECT).fetchall()
        src.rollback()
    with target.engine.connect() as dst:
        dst.exec_driver_sql(insert, [tuple(r) for r in rows])
        dst.commit()
    return time.perf_counter() - started


def bench_rebuild(n: int, pg: str | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fp-bench-proj-"))
    source = fencepost.open(f"sqlite:///{tmp / 'source.db'}")
    print(f"populating a SQLite source with {n} runs ...", flush=True)
    _populate(source, n)
    targets = [("sqlite", f"sqlite:///{tmp / 'target.db'}", None)]
    if pg:
        url, schema = _schema_url(pg)
        targets.append(("postgresql", url, schema))
    print(f"\nRebuild rate, SQLite source with {n} runs (runs/s)")
    print(f"{'target':<12}{'first build':>14}{'rebuild()':>14}{'raw copy':>14}{'ratio build':>13}{'ratio rebuild':>15}")
    swaps: list[tuple[str, float]] = []
    try:
        for name, url, _schema in targets:
            target_db = Database(url)
            migrate(target_db, ("projections",))
            raw = _raw_copy(source.db, target_db)
            with ProjectionBuilder(source, target_db, RunsByStatus()) as builder:
                last_shadow_page = [0.0]

                def hook(shadow: bool, _page, mark=last_shadow_page) -> None:
                    if shadow:
                        mark[0] = time.perf_counter()

                builder._after_page = hook
                t0 = time.perf_counter()
                first = builder.catch_up()
                t1 = time.perf_counter()
                again = builder.rebuild()
                t2 = time.perf_counter()
            swaps.append((name, t2 - last_shadow_page[0]))
            assert first.applied == n and again.applied == n, (first, again)
            build_rate, rebuild_rate, raw_rate = n / (t1 - t0), n / (t2 - t1), n / raw
            print(f"{name:<12}{build_rate:>14,.0f}{rebuild_rate:>14,.0f}{raw_rate:>14,.0f}"
                  f"{build_rate / raw_rate:>13.2f}{rebuild_rate / raw_rate:>15.2f}", flush=True)
            target_db.dispose()
        for name, seconds in swaps:
            print(f"swap transaction ({name}, {n} rows): {seconds * 1000:.0f} ms")
    finally:
        source.close()
        for _name, _url, schema in targets:
            if schema:
                _drop_schema(pg, schema)


def bench_lag(label: str, source_url: str, target_url: str, seconds: float, rate: int) -> None:
    store = fencepost.open(source_url)
    ids: list[str] = []

    def seed(conn):
        for i in range(10_000):
            _runs.create(conn, f"seed-{i:05d}", i)
            ids.append(f"seed-{i:05d}")

    store.db.write(seed)
    builder = ProjectionBuilder(store, target_url, RunsByStatus(), poll_interval=0.5)
    builder.catch_up()
    stop_writer, stop_builder = threading.Event(), threading.Event()
    done = [0]
    transactions = [0]

    def writer() -> None:
        # One mutation per write transaction while the writer keeps up; when commits are slower
        # than the rate (PostgreSQL fsyncs each serialized commit), the deficit is written in one
        # transaction, so the mutation rate holds and the transaction rate is reported beside it.
        rng = random.Random(7)
        started_at = time.perf_counter()
        t = 100_000
        while not stop_writer.is_set():
            due = int((time.perf_counter() - started_at) * rate) + 1 - done[0]
            if due <= 0:
                time.sleep(1.0 / rate)
                continue
            count = min(due, 50)

            def body(conn, count=count, t=t):
                for k in range(count):
                    _runs.random_mutation(conn, rng, ids, "w", t + k)

            store.db.write(body)
            t += count
            done[0] += count
            transactions[0] += 1

    follower = threading.Thread(target=builder.run, args=(stop_builder,))
    writing = threading.Thread(target=writer)
    follower.start()
    time.sleep(0.5)
    writing.start()
    samples: list[int] = []
    started = time.perf_counter()
    time.sleep(1.0)  # warm-up
    while time.perf_counter() - started < seconds:
        samples.append(builder.status().lag)
        time.sleep(0.1)
    elapsed = time.perf_counter() - started
    stop_writer.set()
    writing.join()
    stop_builder.set()
    follower.join()
    builder.close()
    store.close()
    samples.sort()
    achieved = done[0] / elapsed
    txn_rate = transactions[0] / elapsed
    p50 = statistics.median(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    worst = samples[-1]
    to_ms = 1000.0 / achieved
    print(f"{label:<24}{achieved:>10.0f}{txn_rate:>10.0f}{p50:>10.0f}{p99:>10.0f}{worst:>10.0f}"
          f"{p50 * to_ms:>12.0f}{p99 * to_ms:>12.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL URL ('' to skip)")
    parser.add_argument("--lag-seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--skip-rebuild", action="store_true")
    parser.add_argument("--skip-lag", action="store_true")
    args = parser.parse_args()
    pg = args.pg or None
    if not args.skip_rebuild:
        bench_rebuild(args.runs, pg)
    if args.skip_lag:
        return
    print(f"\nSteady-state lag, writer at {args.rate} mutations/s for {args.lag_seconds:.0f} s "
          "(lag in revisions, and in ms of writer time)")
    print(f"{'source -> target':<24}{'mut/s':>10}{'txn/s':>10}{'p50':>10}{'p99':>10}{'max':>10}"
          f"{'p50 ms':>12}{'p99 ms':>12}")
    tmp = Path(tempfile.mkdtemp(prefix="fp-bench-lag-"))
    bench_lag("sqlite -> sqlite", f"sqlite:///{tmp / 's.db'}", f"sqlite:///{tmp / 't.db'}", args.lag_seconds, args.rate)
    if pg:
        src, s1 = _schema_url(pg)
        dst, s2 = _schema_url(pg)
        try:
            bench_lag("postgresql -> postgresql", src, dst, args.lag_seconds, args.rate)
        finally:
            _drop_schema(pg, s1)
            _drop_schema(pg, s2)


if __name__ == "__main__":
    main()
