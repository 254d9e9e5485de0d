"""Sharded write throughput: 4 writer processes on 1, 2 and 4 stores, PostgreSQL schemas and SQLite files.

Run: ``.venv/bin/python bench/shards.py --pg postgresql+psycopg://postgres@127.0.0.1:5432/test
[--seconds 3] [--reps 3] [--procs 4]``

Every writer process loops for ``--seconds`` over its own new runs: ``create``, ``claim_and_own``,
3 x ``heartbeat``, then settle ``completed`` (6 write transactions per run). Contenders, each on
fresh stores prepared (and, for a set, founded) before the clock starts:

* ``1 store``: one plain store (``fencepost.open``): the baseline;
* ``N shards``: a ``fencepost.open_shards`` set of N stores, each run created on the shard its id
  places on (after a lookup that asks every shard whether the id exists), every later call routed
  there; ``1 shard`` is a set of one, the cost of the routing alone;

on N = 2 and 4 PostgreSQL schemas of one server, and on 4 SQLite files (WAL) beside 1. Rounds are
interleaved (every contender once per round, so drift hits all alike); printed are the median
write transactions per second over all processes, the ratio to one store of the same backend and
the share of the machine's CPU time the writer processes used (their own work, not the server's).
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fencepost
from _pg import ScratchSchemas
from fencepost.clock import ManualClock

TX_PER_RUN = 6  # create, claim_and_own, 3 heartbeats, settle
PENDING = fencepost.RunSnapshot("pending", None, None)


def _open(urls: list[str], as_set: bool, clock: Any = None) -> Any:
    return fencepost.open_shards(urls, clock=clock) if as_set else fencepost.open(urls[0], clock=clock)


def _writer(urls: list[str], as_set: bool, idx: int, seconds: float, start: Any, out: Any) -> None:
    store = _open(urls, as_set, ManualClock(0))
    owner = fencepost.OwnerId("bench-host", 30_000 + idx, f"shard-writer-{idx}")
    n = 0
    start.wait()
    cpu = time.process_time()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        rid = f"w{idx}-{n}"
        store.runs.create(rid, "{}")
        store.runs.claim_and_own(rid, PENDING, owner, 0)
        for i in range(1, 4):
            store.runs.heartbeat(rid, owner, i)
        store.runs.transition_owned(rid, owner, "completed", '{"done":true}')
        n += 1
    out.put((n * TX_PER_RUN, time.process_time() - cpu))
    store.close()


def _measure(urls: list[str], as_set: bool, procs: int, seconds: float) -> tuple[float, float]:
    """``(write transactions/s over all processes, writer CPU share of the machine)``."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=_writer, args=(urls, as_set, i, seconds, start, out)) for i in range(procs)]
    for p in ps:
        p.start()
    time.sleep(2.0 + 0.5 * procs)  # let every process open its stores
    start.set()
    try:
        results = [out.get(timeout=60 + seconds) for _ in ps]
    except queue.Empty:  # a writer died (its traceback is on stderr)
        results = [(float("nan"), float("nan"))]
    for p in ps:
        p.join(60)
    tx = sum(r[0] for r in results)
    cpu = sum(r[1] for r in results)
    return tx / seconds, cpu / (seconds * (os.cpu_count() or 1))


def _prepare(urls: list[str], as_set: bool) -> list[str]:
    """Create and migrate the stores (and found the set) before any writer starts."""
    _open(urls, as_set).close()
    return urls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", default=os.environ.get("FENCEPOST_TEST_POSTGRES_URL"),
                    help="PostgreSQL URL (default: $FENCEPOST_TEST_POSTGRES_URL); without it, SQLite only")
    ap.add_argument("--seconds", type=float, default=3.0, help="measured seconds per contender and round")
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds (medians are printed)")
    ap.add_argument("--procs", type=int, default=4, help="writer processes")
    args = ap.parse_args()

    contenders: list[tuple[str, str, int]] = []  # (backend, label, number of stores)
    if args.pg:
        contenders += [("postgresql", "1 store", 1), ("postgresql", "1 shard", 1), ("postgresql", "2 shards", 2),
                       ("postgresql", "4 shards", 4)]
    contenders += [("sqlite", "1 store", 1), ("sqlite", "1 shard", 1), ("sqlite", "4 shards", 4)]

    print(f"{args.procs} writer processes, {TX_PER_RUN} write transactions per run, {args.seconds:g} s per "
          f"measurement, {args.reps} interleaved rounds; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    results: dict[tuple[str, str], list[tuple[float, float]]] = {(b, label): [] for b, label, _ in contenders}
    with tempfile.TemporaryDirectory(prefix="fencepost-bench-shards-") as tmp, \
            ScratchSchemas(args.pg or "postgresql+psycopg://unused") as pg:
        made = 0
        for _ in range(args.reps):
            for backend, label, n in contenders:
                if backend == "postgresql":
                    urls = [pg.new()[1] for _ in range(n)]
                else:
                    urls = [f"sqlite:///{Path(tmp) / f'db-{made + i}.db'}" for i in range(n)]
                    made += n
                as_set = label != "1 store"
                results[(backend, label)].append(_measure(_prepare(urls, as_set), as_set, args.procs, args.seconds))
        if not args.pg:
            pg._names.clear()  # nothing to drop on a server that was never used

    print(f"{'backend':<12}{'stores':<10}{'write tx/s':>12}{'vs 1 store':>12}{'writer CPU':>12}")
    for backend, label, _ in contenders:
        rates = [r[0] for r in results[(backend, label)]]
        cpus = [r[1] for r in results[(backend, label)]]
        base = statistics.median(r[0] for r in results[(backend, "1 store")])
        rate = statistics.median(rates)
        print(f"{backend:<12}{label:<10}{rate:>12,.0f}{rate / base:>11.2f}x{statistics.median(cpus):>11.0%}",
              flush=True)


if __name__ == "__main__":
    main()
