"""Processes for the change-feed races (importable by multiprocessing's spawn start method)."""

from __future__ import annotations

import random
import time

from sqlalchemy import text

import fencepost

SHARED = [f"shared-{i}" for i in range(8)]
_INSERT = text(
    "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES (:r, 'pending', :s, :c)"
)
_UPDATE = text("UPDATE flows_runs SET status = :st, state_json = :s WHERE run_id = :r")
_DELETE = text("DELETE FROM flows_runs WHERE run_id = :r")
_EXISTS = text("SELECT 1 FROM flows_runs WHERE run_id = :r")


class _Rollback(Exception):
    pass


def churn(url: str, k: int, start, duration: float, seed: int) -> int:
    """Create, mutate and delete runs as fast as possible for ``duration`` seconds; return commits.

    A mix of single-row and multi-row transactions on this writer's own ids and on ids shared by
    every writer (so mutations coalesce and re-create tombstoned ids), plus some rolled-back ones.
    """
    store = fencepost.open(url)
    rng = random.Random(seed)
    live: list[str] = []
    made = 0
    commits = 0
    start.wait()
    end = time.monotonic() + duration
    try:
        while time.monotonic() < end:
            op = rng.random()
            created: list[str] = []
            removed: list[str] = []

            def body(conn, op=op, created=created, removed=removed):
                nonlocal made
                created.clear()  # a transient failure re-runs the whole body
                removed.clear()
                if op < 0.35 or not live:
                    rid = f"w{k}-{made}"
                    made += 1
                    conn.execute(_INSERT, {"r": rid, "s": "{}", "c": made})
                    created.append(rid)
                elif op < 0.60:
                    conn.execute(_UPDATE, {"r": rng.choice(live), "st": rng.choice(["suspended", "completed"]),
                                           "s": f'{{"n": {rng.randrange(1000)}}}'})
                elif op < 0.70:
                    rid = rng.choice(live)
                    conn.execute(_DELETE, {"r": rid})
                    removed.append(rid)
                elif op < 0.85:
                    rid = rng.choice(SHARED)
                    if conn.execute(_EXISTS, {"r": rid}).first() is None:
                        conn.execute(_INSERT, {"r": rid, "s": "{}", "c": 0})
                    elif rng.random() < 0.5:
                        conn.execute(_UPDATE, {"r": rid, "st": "failed", "s": "[]"})
                    else:
                        conn.execute(_DELETE, {"r": rid})
                elif op < 0.95:
                    for _ in range(2):
                        rid = f"w{k}-{made}"
                        made += 1
                        conn.execute(_INSERT, {"r": rid, "s": "{}", "c": made})
                        created.append(rid)
                    conn.execute(_UPDATE, {"r": created[0], "st": "completed", "s": "{}"})
                else:
                    conn.execute(_INSERT, {"r": f"ghost-{k}-{made}", "s": "{}", "c": 0})
                    made += 1
                    raise _Rollback

            try:
                store.db.write(body)
            except _Rollback:
                continue
            commits += 1
            live.extend(created)
            for rid in removed:
                live.remove(rid)
    finally:
        store.close()
    return commits


def churn_to_queue(url: str, k: int, start, duration: float, seed: int, results) -> None:
    results.put(churn(url, k, start, duration, seed))


def insert_one(url: str, run_id: str) -> None:
    """Commit one run from this (separate) process."""
    with fencepost.open(url) as store:
        store.db.write(lambda conn: conn.execute(_INSERT, {"r": run_id, "s": "{}", "c": 0}))
