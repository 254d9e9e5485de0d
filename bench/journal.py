"""Journal append throughput beside the raw driver and the ``eventsourcing`` library (SQLite).

Run: ``.venv/bin/python bench/journal.py [--rounds 5] [--single 1000] [--batches 50] [--synchronous FULL]``
(needs ``pip install 'eventsourcing==9.5.*'``, the ``bench`` extra).

Each round runs every contender once, in turn (interleaved, so disk and CPU drift hit all alike),
each on its own SQLite file in WAL mode with the same ``synchronous`` setting:

* ``fencepost``: ``store.journal.append`` (fenced: the consensus guard runs in the transaction) and
  ``append_unfenced``, one entry per write transaction, hash chain, redaction and validation on;
  batches through ``store.journal.append_many`` (100 entries, one transaction);
* ``raw sqlite3``: ``BEGIN IMMEDIATE``, the same INSERT into the same table with rows of the same
  sizes built before timing (no lookups, no hashing, no validation), ``COMMIT``; batches as one
  ``executemany``: the floor;
* ``eventsourcing``: an ``Application`` on ``eventsourcing.sqlite`` saving an aggregate with one new
  event per save (batches: 100 pending events per save), and its ``SQLiteApplicationRecorder``
  inserting pre-built ``StoredEvent`` objects directly.

Prints the median rate per contender and the ratios. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import fencepost
from fencepost._values import canonical_json
from fencepost.clock import SystemClock
from fencepost.journal import NewEntry, OwnerId

BATCH = 100


def _payload(i: int) -> dict[str, object]:
    return {"step": "fetch", "attempt": i, "status": "ok", "detail": {"rows": 12, "ms": 3.5}}


class Fencepost:
    def __init__(self, root: Path, sync: str) -> None:
        self.store = fencepost.open(f"sqlite:///{root / 'fencepost.db'}?synchronous={sync}", clock=SystemClock())
        self.owner = OwnerId("bench-host", os.getpid(), "bench-nonce")
        with self.store.db.connect() as conn:
            conn.exec_driver_sql(
                "INSERT INTO flows_consensus_leases (run_id, owner_host_id, owner_pid, owner_nonce, granted_at_ms,"
                " heartbeat_at_ms) VALUES ('run-fenced', 'bench-host', ?, 'bench-nonce', 0, 0)",
                (os.getpid(),),
            )
            conn.commit()
        self.i = 0

    def single_fenced(self) -> None:
        self.i += 1
        self.store.journal.append("run-fenced", "step.finished", _payload(self.i), owner=self.owner, source_id="w")

    def single_unfenced(self) -> None:
        self.i += 1
        self.store.journal.append_unfenced("run-open", "step.finished", _payload(self.i), source_id="w")

    def batch(self) -> None:
        entries = [NewEntry("step.finished", _payload(self.i + k)) for k in range(BATCH)]
        self.i += BATCH
        self.store.journal.append_many("run-fenced", entries, owner=self.owner, source_id="w")


class Raw:
    """The same INSERTs (same table, same row sizes: canonical payload text, 64-hex hashes), rows
    built before the clock starts: only the driver and SQLite are measured."""

    def __init__(self, root: Path, sync: str, rows_needed: int) -> None:
        fencepost.open(f"sqlite:///{root / 'raw.db'}").close()  # same migrated schema
        self.conn = sqlite3.connect(root / "raw.db", isolation_level=None, check_same_thread=False)
        self.conn.execute(f"PRAGMA synchronous = {sync}")
        self.sql = (
            "INSERT INTO flows_journal_events (run_id, seq, event_id, source_id, source_seq, emitted_at_ms,"
            " event_type, payload_json, meta_json, content_hash, position, stream_prev_hash, log_prev_hash,"
            " entry_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
        )
        self.rows = [self._row(s) for s in range(rows_needed)]
        self.next = 0

    @staticmethod
    def _row(s: int) -> tuple[object, ...]:
        payload = canonical_json(_payload(s)).decode()
        h = [os.urandom(32).hex() for _ in range(4)]
        return ("run-raw", s, f"flows:event:7:run-raw1:w{s}", "w", s, int(time.time() * 1000), "step.finished",
                payload, "{}", h[0], s + 1, h[1], h[2], h[3])

    def _take(self, n: int) -> list[tuple[object, ...]]:
        rows = self.rows[self.next:self.next + n]
        self.next += n
        return rows

    def single(self) -> None:
        (row,) = self._take(1)
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(self.sql, row)
        self.conn.execute("COMMIT")

    def batch(self) -> None:
        rows = self._take(BATCH)
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(self.sql, rows)
        self.conn.execute("COMMIT")


class EventSourcing:
    def __init__(self, root: Path, sync: str) -> None:
        from eventsourcing.application import Application
        from eventsourcing.domain import Aggregate, event
        from eventsourcing.persistence import StoredEvent
        from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteConnectionPool, SQLiteDatastore

        original = SQLiteConnectionPool._create_connection

        def create_connection(pool: SQLiteConnectionPool):  # same synchronous setting as the others
            c = original(pool)
            c._sqlite_conn.execute(f"PRAGMA synchronous = {sync}")
            return c

        SQLiteConnectionPool._create_connection = create_connection  # type: ignore[method-assign]

        class Step(Aggregate):
            @event("Started")
            def __init__(self, name: str) -> None:
                self.name = name

            @event("Finished")
            def finish(self, detail: dict) -> None:
                self.detail = detail

        self.Step = Step
        self.StoredEvent = StoredEvent
        self.app = Application(env={"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                                    "SQLITE_DBNAME": str(root / "es-app.db")})
        self.step = Step("fetch")
        self.app.save(self.step)
        self.i = 0
        datastore = SQLiteDatastore(str(root / "es-recorder.db"))
        self.recorder = SQLiteApplicationRecorder(datastore)
        self.recorder.create_table()
        self.oid = uuid.uuid4()
        self.version = 0

    def app_single(self) -> None:
        self.i += 1
        self.step.finish(_payload(self.i))
        self.app.save(self.step)

    def app_batch(self) -> None:
        for _ in range(BATCH):
            self.i += 1
            self.step.finish(_payload(self.i))
        self.app.save(self.step)

    def _stored(self) -> object:
        self.version += 1
        return self.StoredEvent(self.oid, self.version, "Step.Finished", b'{"attempt":1}')

    def recorder_single(self) -> None:
        self.recorder.insert_events([self._stored()])

    def recorder_batch(self) -> None:
        self.recorder.insert_events([self._stored() for _ in range(BATCH)])


def _rate(fn: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--single", type=int, default=1000, help="single-entry appends per contender per round")
    parser.add_argument("--batches", type=int, default=50, help="100-entry batches per contender per round")
    parser.add_argument("--synchronous", default="FULL", choices=["OFF", "NORMAL", "FULL", "EXTRA"])
    parser.add_argument("--dir", default=None, help="directory for the database files (default: a temp dir)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="fencepost-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    rows_needed = (args.rounds * args.single + 1) + (args.rounds * args.batches + 1) * BATCH
    fp, raw = Fencepost(root, args.synchronous), Raw(root, args.synchronous, rows_needed)
    es = EventSourcing(root, args.synchronous)

    single = {
        "fencepost append (fenced)": fp.single_fenced,
        "fencepost append_unfenced": fp.single_unfenced,
        "raw sqlite3 insert": raw.single,
        "eventsourcing Application.save": es.app_single,
        "eventsourcing recorder insert_events": es.recorder_single,
    }
    batch = {
        "fencepost append_many (fenced)": fp.batch,
        "raw sqlite3 executemany": raw.batch,
        "eventsourcing Application.save": es.app_batch,
        "eventsourcing recorder insert_events": es.recorder_batch,
    }
    results: dict[str, dict[str, list[float]]] = {"single": {k: [] for k in single}, "batch": {k: [] for k in batch}}
    for fn in [*single.values(), *batch.values()]:  # warm up: caches, prepared statements, WAL files
        fn()
    for r in range(args.rounds):
        order = list(single.items())
        order = order[r % len(order):] + order[: r % len(order)]
        for name, fn in order:
            results["single"][name].append(_rate(fn, args.single))
        border = list(batch.items())
        border = border[r % len(border):] + border[: r % len(border)]
        for name, fn in border:
            results["batch"][name].append(_rate(fn, args.batches))

    print(f"SQLite WAL, synchronous={args.synchronous}, {args.rounds} interleaved rounds, files in {root}")
    for kind, unit, fp_names, base_names in (
        ("single", "appends/s (one transaction each)", ["fencepost append (fenced)", "fencepost append_unfenced"],
         ["eventsourcing Application.save", "eventsourcing recorder insert_events", "raw sqlite3 insert"]),
        ("batch", f"{BATCH}-entry batches/s", ["fencepost append_many (fenced)"],
         ["eventsourcing Application.save", "eventsourcing recorder insert_events", "raw sqlite3 executemany"]),
    ):
        print(f"\n{unit}")
        medians = {k: statistics.median(v) for k, v in results[kind].items()}
        for name, value in medians.items():
            print(f"  {name:40s} {value:10.0f}")
        for f in fp_names:
            for b in base_names:
                print(f"  ratio {f} / {b}: {medians[f] / medians[b]:.2f}x")


if __name__ == "__main__":
    main()
