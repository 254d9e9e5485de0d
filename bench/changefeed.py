"""Change-feed benchmark: throughput, page cost against table size, commit-to-follow latency.

Run by hand (figures are printed, never asserted):

    .venv/bin/python bench/changefeed.py                       # SQLite in a temp dir
    .venv/bin/python bench/changefeed.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/changefeed.py --large 1000000 ...   # page cost at 10 000 vs --large runs

1. ``changes_since`` throughput: every change of ``--runs`` runs paged 500 at a time, beside the
   same keyset scan issued straight through the driver (sqlite3 / psycopg), with the ratio.
2. Page cost: one ``changes_since`` page (500), one ``read`` of 200 ids and one ``list_runs`` page
   (100) from the middle of a 10 000-run store and of a ``--large``-run store.
3. Commit-to-follow latency: a second store commits one run at a time; the time from just before the
   commit call to the follower yielding it, p50 and p99.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import fencepost
from fencepost import Position

PAGE = 500


def _fill(store: fencepost.Store, n: int, start: int = 0) -> None:
    """Insert runs start..start+n-1 in one statement (the revision triggers still fire per row)."""
    if store.db.name == "sqlite":
        sql = (
            f"WITH RECURSIVE s(i) AS (SELECT {start} UNION ALL SELECT i + 1 FROM s WHERE i < {start + n - 1}) "
            "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) "
            "SELECT printf('r%09d', i), 'pending', '{\"flowName\": \"f\"}', i FROM s"
        )
    else:
        sql = (
            "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) "
            "SELECT 'r' || lpad(i::text, 9, '0'), 'pending', '{\"flowName\": \"f\"}', i "
            f"FROM generate_series({start}, {start + n - 1}) AS i"
        )
    chunk = 200_000
    if n > chunk:
        for offset in range(0, n, chunk):
            _fill(store, min(chunk, n - offset), start + offset)
        return
    store.db.write(lambda conn: conn.exec_driver_sql(sql))


def _analyze(store: fencepost.Store) -> None:
    """Give the planner statistics, as autovacuum / a long-lived database would have them."""
    if store.db.name == "sqlite":
        store.db.write(lambda conn: conn.exec_driver_sql("ANALYZE"))
        return
    with store.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE flows_runs")
        conn.exec_driver_sql("VACUUM ANALYZE flows_run_changes")


def _open(kind: str, pg_url: str | None, tmp: Path) -> tuple[fencepost.Store, str, object]:
    if kind == "sqlite":
        url = f"sqlite:///{tmp / (uuid.uuid4().hex[:8] + '.db')}"
        return fencepost.open(url), url, None
    schema = "bench_cf_" + uuid.uuid4().hex[:8]
    sep = "&" if "?" in pg_url else "?"
    url = f"{pg_url}{sep}schema={schema}"
    return fencepost.open(url), url, schema


def _drop(store: fencepost.Store, schema: object) -> None:
    if schema is not None:
        store.db.write(lambda conn: conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE'))
    store.close()


def _feed_scan(store: fencepost.Store) -> int:
    position = Position(store.feed.position().source, 0)
    seen = 0
    while True:
        batch = store.feed.changes_since(position, PAGE)
        seen += len(batch.changes)
        position = batch.next_position
        if not batch.has_more:
            return seen


def _raw_scan(store: fencepost.Store) -> int:
    """The same keyset scan through the bare driver: one snapshot per page, position then rows."""
    seen = 0
    if store.db.name == "sqlite":
        import sqlite3

        conn = sqlite3.connect(str(store.db.path), isolation_level=None)
        after = 0
        while True:
            conn.execute("BEGIN")
            (watermark,) = conn.execute("SELECT revision FROM flows_run_source WHERE singleton = 1").fetchone()
            rows = conn.execute(
                "SELECT run_id, revision, deleted FROM flows_run_changes WHERE revision > ? AND revision <= ? "
                "ORDER BY revision LIMIT ?",
                (after, watermark, PAGE + 1),
            ).fetchall()
            conn.execute("COMMIT")
            page = rows[:PAGE]
            seen += len(page)
            if len(rows) <= PAGE:
                break
            after = page[-1][1]
        conn.close()
        return seen
    import psycopg

    url = store.db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, options=f"-c search_path={store.db.schema}") as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        after = 0
        while True:
            with conn.transaction():
                (watermark,) = conn.execute("SELECT revision FROM flows_run_source WHERE singleton = 1").fetchone()
                rows = conn.execute(
                    "SELECT run_id, revision, deleted FROM flows_run_changes WHERE revision > %s AND revision <= %s "
                    "ORDER BY revision LIMIT %s",
                    (after, watermark, PAGE + 1),
                ).fetchall()
            page = rows[:PAGE]
            seen += len(page)
            if len(rows) <= PAGE:
                break
            after = page[-1][1]
    return seen


def throughput(kind: str, pg_url: str | None, tmp: Path, runs: int) -> None:
    store, _url, schema = _open(kind, pg_url, tmp)
    try:
        t = time.perf_counter()
        _fill(store, runs)
        print(f"[{kind}] loaded {runs} runs in {time.perf_counter() - t:.1f}s")
        _analyze(store)
        best_feed = best_raw = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            assert _feed_scan(store) == runs
            best_feed = min(best_feed, time.perf_counter() - t)
            t = time.perf_counter()
            assert _raw_scan(store) == runs
            best_raw = min(best_raw, time.perf_counter() - t)
        feed_rate, raw_rate = runs / best_feed, runs / best_raw
        print(
            f"[{kind}] changes_since pages of {PAGE}: {feed_rate:,.0f} changes/s; raw driver keyset scan "
            f"{raw_rate:,.0f} changes/s; ratio feed/raw = {feed_rate / raw_rate:.2f}"
        )
    finally:
        _drop(store, schema)


def _page_costs(store: fencepost.Store, n: int, rounds: int = 100) -> tuple[float, float, float]:
    source = store.feed.position().source
    middle = Position(source, n // 2)
    ids = [f"r{i:09d}" for i in range(n // 2, n // 2 + 200)]
    # A cursor from the middle of the key range.
    page = store.feed.list_runs({"created_after_ms": n // 2}, None, 1)
    cursor = page.cursor

    def timed(fn) -> float:
        fn()
        samples = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
        return statistics.median(samples) * 1000

    a = timed(lambda: store.feed.changes_since(middle, PAGE))
    b = timed(lambda: store.feed.read(ids))
    c = timed(lambda: store.feed.list_runs({"created_after_ms": n // 2}, cursor, 100))
    return a, b, c


def page_cost(kind: str, pg_url: str | None, tmp: Path, small: int, large: int) -> None:
    rows = []
    for n in (small, large):
        store, _url, schema = _open(kind, pg_url, tmp)
        try:
            t = time.perf_counter()
            _fill(store, n)
            load = time.perf_counter() - t
            _analyze(store)
            rows.append((n, load, *_page_costs(store, n)))
        finally:
            _drop(store, schema)
    for n, load, a, b, c in rows:
        print(
            f"[{kind}] {n:>9,} runs (loaded in {load:.1f}s): changes_since(500) {a:.2f} ms, "
            f"read(200) {b:.2f} ms, list_runs(100) {c:.2f} ms  (medians)"
        )
    (_, _, a0, b0, c0), (_, _, a1, b1, c1) = rows
    print(f"[{kind}] page cost ratio {large:,} vs {small:,}: changes_since {a1 / a0:.2f}x, "
          f"read {b1 / b0:.2f}x, list_runs {c1 / c0:.2f}x")


def latency(kind: str, pg_url: str | None, tmp: Path, samples: int) -> None:
    store, url, schema = _open(kind, pg_url, tmp)
    writer = fencepost.open(url)
    stop = threading.Event()
    received: dict[str, float] = {}

    def follow() -> None:
        for change in store.feed.follow(stop=stop, poll_interval=5.0):
            received[change.run_id] = time.perf_counter()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        time.sleep(0.5)
        sent: dict[str, float] = {}
        committed: dict[str, float] = {}
        for i in range(samples):
            rid = f"lat-{i}"
            sent[rid] = time.perf_counter()
            writer.db.write(
                lambda conn, rid=rid: conn.exec_driver_sql(
                    "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) "
                    f"VALUES ('{rid}', 'pending', '{{}}', 0)"
                )
            )
            committed[rid] = time.perf_counter()
            deadline = time.perf_counter() + 10
            while rid not in received and time.perf_counter() < deadline:
                time.sleep(0.0002)
            time.sleep(0.01)
        def pct(values: list[float], q: float) -> float:
            return values[min(len(values) - 1, int(len(values) * q))]

        lat = sorted((received[r] - sent[r]) * 1000 for r in sent if r in received)
        after = sorted(max(0.0, received[r] - committed[r]) * 1000 for r in sent if r in received)
        write = sorted((committed[r] - sent[r]) * 1000 for r in sent)
        print(f"[{kind}] commit-to-follow latency over {len(lat)} commits: p50 {pct(lat, 0.5):.1f} ms, "
              f"p99 {pct(lat, 0.99):.1f} ms from the start of the write call; p50 {pct(after, 0.5):.1f} ms, "
              f"p99 {pct(after, 0.99):.1f} ms after the write call returned (the write itself: p50 "
              f"{pct(write, 0.5):.1f} ms)")
    finally:
        stop.set()
        thread.join(10)
        writer.close()
        _drop(store, schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", help="PostgreSQL URL (postgresql+psycopg://...); omit for SQLite only")
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--skip", default="", help="comma list of: throughput,pages,latency")
    args = parser.parse_args()
    kinds = ["sqlite"] + (["postgresql"] if args.postgres else [])
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for kind in kinds:
            if "throughput" not in skip:
                throughput(kind, args.postgres, tmp, args.runs)
            if "pages" not in skip:
                page_cost(kind, args.postgres, tmp, args.small, args.large)
            if "latency" not in skip:
                latency(kind, args.postgres, tmp, args.samples)


if __name__ == "__main__":
    main()
