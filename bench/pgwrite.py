"""PostgreSQL write ceiling: write transactions per second with 1, 2, 4 and 8 writer processes.

Run: ``.venv/bin/python bench/pgwrite.py --pg postgresql+psycopg://postgres@127.0.0.1:5432/test
[--seconds 5] [--procs 1,2,4,8]``

Every writer process loops for ``--seconds`` over its own runs: ``claim_and_own``, 3 x ``heartbeat``,
one fenced journal ``append``, then settle (7 write transactions per run, creation included). Contenders, each in its
own schema, run one after the other for each process count:

* ``fencepost``: the run store and journal as shipped (every write transaction takes the
  per-schema advisory lock first);
* ``raw psycopg``: the same statements through the bare driver with the same lock
  (``bench/runstore.py``'s baseline, plus the journal insert of the append);
* ``eventsourcing``: ``Application.save`` of one new event per transaction, which takes an
  ``EXCLUSIVE`` table lock the same way (7 saves per run, to count the same transactions).

Printed: write transactions per second over all processes, and the ratio to one process.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fencepost
import runstore as rs_bench
from _pg import ScratchSchemas
from fencepost.clock import ManualClock

TX_PER_RUN = 7  # create, claim_and_own, 3 heartbeats, append, settle


def _fencepost(url: str, idx: int, seconds: float, start: Any, out: Any) -> None:
    store = fencepost.open(url, clock=ManualClock(0))
    owner = fencepost.OwnerId("bench-host", 10_000 + idx, f"writer-{idx}")
    n = 0
    start.wait()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        rid = f"p{idx}-{n}"
        store.runs.create(rid, "{}")
        store.runs.claim_and_own(rid, fencepost.RunSnapshot("pending", None, None), owner, 0)
        for i in range(1, 4):
            store.runs.heartbeat(rid, owner, i)
        store.journal.append(rid, "step.finished", {"n": n}, owner=owner, source_id="w")
        store.runs.transition_owned(rid, owner, "completed", '{"done":true}')
        n += 1
    out.put(n * TX_PER_RUN)
    store.close()


def _raw(url: str, schema: str, base: str, idx: int, seconds: float, start: Any, out: Any) -> None:
    store = fencepost.open(url, clock=ManualClock(0))  # creates the rows; the raw driver does the work
    with ScratchSchemas(base) as pg:
        conn = pg.connect(schema)
        pg._names.clear()  # the schema is the parent's to drop
    raw = rs_bench.Raw("postgresql", conn, schema)
    rs_bench.OWNER = fencepost.OwnerId("bench-host", 20_000 + idx, f"raw-{idx}")
    n = 0
    start.wait()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        rid = f"q{idx}-{n}"
        store.runs.create(rid, "{}")
        raw.one_run(rid, 0)  # claim_and_own + 3 heartbeats + settle, the run store's statements
        raw.begin()
        raw.fact(rid, "appended", None, 0)  # the journal append's statements
        raw.commit()
        n += 1
    out.put(n * TX_PER_RUN)
    conn.close()
    store.close()


def _eventsourcing(env: dict[str, str], idx: int, seconds: float, start: Any, out: Any) -> None:
    os.environ.update(env)
    from table import EventSourcingAppends

    es = EventSourcingAppends(env)
    n = 0
    start.wait()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        es.single(TX_PER_RUN)
        n += 1
    out.put(n * TX_PER_RUN)
    es.close()


def _measure(target: Any, args: tuple[Any, ...], procs: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=target, args=(*args, i, seconds, start, out)) for i in range(procs)]
    for p in ps:
        p.start()
    time.sleep(2.0 + 0.5 * procs)  # let every process open its store
    start.set()
    try:
        total = sum(out.get(timeout=60 + seconds) for _ in ps)
    except queue.Empty:  # a writer died (its traceback is on stderr)
        total = float("nan")
    for p in ps:
        p.join(60)
    return total / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", default=os.environ.get("FENCEPOST_TEST_POSTGRES_URL"), required=False)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--procs", default="1,2,4,8")
    args = ap.parse_args()
    if not args.pg:
        ap.error("--pg is required")
    counts = [int(c) for c in args.procs.split(",")]
    from sqlalchemy.engine import make_url

    u = make_url(args.pg)
    print(f"write transactions/s, {TX_PER_RUN} per run, {args.seconds:.0f} s per measurement; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'processes':>10}{'fencepost':>12}{'raw psycopg':>14}{'eventsourcing':>15}{'ours/raw':>10}{'ours/es':>9}")
    with ScratchSchemas(args.pg) as pg:
        import psycopg

        for procs in counts:
            _, ours_url = pg.new()
            raw_schema, raw_url = pg.new()
            es_schema, _ = pg.new()
            fencepost.open(ours_url).close()
            fencepost.open(raw_url).close()
            with psycopg.connect(pg.dsn, autocommit=True) as c:
                c.execute(f'CREATE SCHEMA "{es_schema}"')
            env = {"PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": u.database or "postgres",
                   "POSTGRES_HOST": u.host or "127.0.0.1", "POSTGRES_PORT": str(u.port or 5432),
                   "POSTGRES_USER": u.username or "postgres", "POSTGRES_PASSWORD": u.password or "",
                   "POSTGRES_SCHEMA": es_schema}
            from table import EventSourcingAppends

            EventSourcingAppends(env).close()  # its tables, created once before the writers start
            ours = _measure(_fencepost, (ours_url,), procs, args.seconds)
            raw = _measure(_raw, (raw_url, raw_schema, args.pg), procs, args.seconds)
            # The writers only use the tables (creating them at once races in the catalog).
            es = _measure(_eventsourcing, ({**env, "CREATE_TABLE": "false"},), procs, args.seconds)
            print(f"{procs:>10}{ours:>12,.0f}{raw:>14,.0f}{es:>15,.0f}{ours / raw:>10.2f}{ours / es:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
