"""Every row of the performance table in one run: fencepost beside its baseline, same-run ratios.

Run: ``.venv/bin/python bench/table.py [--pg postgresql+psycopg://postgres@127.0.0.1:5432/test] [--reps 5]``
(needs the ``bench`` extra: ``eventsourcing`` 9.5, and ``psycopg-pool`` for its PostgreSQL module).

Each row runs fencepost and its baseline alternately (ours/base, then base/ours, ...) for ``--reps``
reps; the printed figures are the medians of the per-rep rates and of the per-rep ratios (ours /
base, higher is better for fencepost). Absolute rates move a lot between runs on a shared machine:
read the ratios. Rows (SQLite in WAL mode; PostgreSQL where the row exists there, with ``--pg``):

* ``append``: one fenced ``store.journal.append`` per write transaction vs ``eventsourcing``
  ``Application.save`` of an aggregate with one new event (SQLite ``synchronous=FULL`` and
  ``NORMAL``; PostgreSQL through ``eventsourcing.postgres``).
* ``raw sqlite3 insert (the ceiling)``: the raw driver inserting rows of the same size into the
  same journal table, one transaction each, vs the same peer: how far any store that commits each
  append durably on its own can get ahead of it.
* ``append x8 threads``: 8 threads of one process appending fenced entries at once, each to its
  own run, on one store, vs 8 threads doing 1-event ``Application.save`` calls on one application.
* ``run-store hot path``: ``claim_and_own`` + 3 x ``heartbeat`` + settle per run vs the raw driver
  executing the same statements with the same transaction boundaries (``bench/runstore.py``).
* ``changes_since(500)``: paging every change of ``--feed-runs`` runs vs the same keyset scan
  through the raw driver (``bench/changefeed.py``).
* ``RunsByStatus first build``: ``ProjectionBuilder.catch_up()`` of ``--build-runs`` runs into a
  fresh target (a new SQLite file / a new PostgreSQL schema, the builder's migration applied first)
  vs the raw driver reading ``(run_id, status, revision)`` of every run from the source and inserting
  them into a fresh table on the target in one transaction.
* ``RunsByStatus first build vs raw, same statements``: the same build against the raw driver
  sending the statements a build cannot do without, page by page: the change page with its
  snapshots (one read transaction), then both upserts (the read model, the held revisions) and a
  COMMIT on the target (durable for the last page only, as the builder's). It shows how much of
  the first row's gap is the work itself.
* ``raw writes of a first build only``: the target's side of that raw loop alone (both upserts and a
  COMMIT per page, the pages read beforehand and not timed) vs the three-column copy, reads
  included: the ceiling the read model's columns and index and the held revisions set on any build
  (SQLite).

Nothing is asserted: timing is for reading, never for CI.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import changefeed as cf_bench
import fencepost
import journal as journal_bench
import projections as proj_bench
import runstore as rs_bench
from _pg import ScratchSchemas
from fencepost._durable import Database
from fencepost._migrations import migrate
from fencepost.clock import ManualClock, SystemClock
from fencepost.journal import OwnerId
from fencepost.projections import ProjectionBuilder, RunsByStatus

THREADS = 8
Row = tuple[str, str, float, float, float, float, str]  # path, backend, ours, base, ratio, cpu ratio, unit
ROWS: list[Row] = []


def _payload(i: int) -> dict[str, object]:
    return {"step": "fetch", "attempt": i, "status": "ok", "detail": {"rows": 12, "ms": 3.5}}


class Timer:
    """Wall and process-CPU seconds of one timed section (CPU: every thread of this process)."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def rate(self, n: float) -> tuple[float, float]:
        return n / self.wall, n / max(self.cpu, 1e-9)


Sample = tuple[float, float]  # (units per wall second, units per CPU second of this process)


def interleaved(reps: int, ours: Callable[[], Sample], base: Callable[[], Sample]
                ) -> tuple[list[Sample], list[Sample]]:
    """Run ``ours`` and ``base`` alternately (each returns a ``Sample``); per-rep samples of both."""
    a: list[Sample] = []
    b: list[Sample] = []
    ours()  # warm-up: caches, prepared statements, WAL files
    base()
    for r in range(reps):
        if r % 2 == 0:
            a.append(ours())
            b.append(base())
        else:
            b.append(base())
            a.append(ours())
    return a, b


def record(path: str, backend: str, unit: str, ours: list[Sample], base: list[Sample]) -> None:
    ratios = [x[0] / y[0] for x, y in zip(ours, base, strict=True)]
    cpu = statistics.median(x[1] / y[1] for x, y in zip(ours, base, strict=True))
    row = (path, backend, statistics.median(x[0] for x in ours), statistics.median(x[0] for x in base),
           statistics.median(ratios), cpu, unit)
    ROWS.append(row)
    print(f"  {path} [{backend}]: ours {row[2]:,.0f} {unit}, base {row[3]:,.0f} {unit}, median ratio {row[4]:.2f}x "
          f"(reps {' '.join(f'{x:.2f}' for x in ratios)}); CPU-time ratio {cpu:.2f}x", flush=True)


def copy_log(store: fencepost.Store) -> None:
    """Timed, at the end of a section: copy what is left of a SQLite store's log into its database
    file now. The peer and the raw driver copy their logs inside their own commits; the store's
    thread copies a tenth of a second after writes, so without this the copy of a section's last
    writes would run on the clock of whatever is timed next."""
    checkpointer = getattr(store.db.backend, "checkpointer", None)
    if checkpointer is None:
        return
    conn = sqlite3.connect(store.db.path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA synchronous = {checkpointer._synchronous}")
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    finally:
        conn.close()


def quiet(*stores: fencepost.Store) -> None:
    """Untimed: wait until each SQLite store's checkpoint thread has nothing left to do (after
    ``copy_log``, or after writes that are not timed, such as seeding)."""
    for store in stores:
        checkpointer = getattr(store.db.backend, "checkpointer", None)
        if checkpointer is not None:
            checkpointer.idle(10)


# --------------------------------------------------------------------------- journal appends
class FencepostAppends:
    """Fenced single-entry appends on one store; ``threads`` writers each on its own run."""

    def __init__(self, url: str) -> None:
        self.store = fencepost.open(url, clock=SystemClock())
        self.i = 0
        self.owners: dict[str, OwnerId] = {}
        marker = "?" if self.store.db.name == "sqlite" else "%s"
        with self.store.db.connect() as conn:
            for k in range(THREADS + 1):
                run_id, owner = f"run-fenced-{k}", OwnerId("bench-host", os.getpid(), f"bench-nonce-{k}")
                conn.exec_driver_sql(
                    "INSERT INTO flows_consensus_leases (run_id, owner_host_id, owner_pid, owner_nonce, granted_at_ms,"
                    f" heartbeat_at_ms) VALUES ({marker}, {marker}, {marker}, {marker}, 0, 0)",
                    (run_id, owner.host_id, owner.pid, owner.nonce),
                )
                self.owners[run_id] = owner
            conn.commit()

    def _append(self, run_id: str, i: int) -> None:
        self.store.journal.append(run_id, "step.finished", _payload(i), owner=self.owners[run_id], source_id="w")

    def single(self, n: int) -> Sample:
        with Timer() as t:
            for _ in range(n):
                self.i += 1
                self._append(f"run-fenced-{THREADS}", self.i)
            copy_log(self.store)
        quiet(self.store)
        return t.rate(n)

    def threaded(self, n: int) -> Sample:
        def work(k: int) -> None:
            barrier.wait()
            for i in range(n):
                self._append(f"run-fenced-{k}", i)

        sample = _run_threads(work, n, after=lambda: copy_log(self.store))
        quiet(self.store)
        return sample

    def close(self) -> None:
        self.store.close()


def _run_threads(work: Callable[[int], None], n: int, after: Callable[[], None] | None = None) -> Sample:
    global barrier
    barrier = threading.Barrier(THREADS + 1)
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:
            errors.append(exc)
            raise

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    with Timer() as timer:
        barrier.wait()
        for t in threads:
            t.join()
        if after is not None:
            after()
    if errors:
        raise errors[0]
    return timer.rate(THREADS * n)


barrier = threading.Barrier(1)
_ES_SQLITE_SYNC = ["FULL"]
_es_patched = [False]


_STEP: list[Any] = []


def _step_class() -> Any:
    """The peer's aggregate, defined once (it registers its class by topic)."""
    if not _STEP:
        from eventsourcing.domain import Aggregate, event

        class Step(Aggregate):
            @event("Started")
            def __init__(self, name: str) -> None:
                self.name = name

            @event("Finished")
            def finish(self, detail: dict) -> None:
                self.detail = detail

        _STEP.append(Step)
    return _STEP[0]


class EventSourcingAppends:
    """``eventsourcing`` ``Application.save`` of one aggregate with one new event per save."""

    def __init__(self, env: dict[str, str]) -> None:
        from eventsourcing.application import Application

        if env["PERSISTENCE_MODULE"] == "eventsourcing.sqlite" and not _es_patched[0]:
            from eventsourcing.sqlite import SQLiteConnectionPool

            original = SQLiteConnectionPool._create_connection

            def create_connection(pool: Any) -> Any:  # the same synchronous setting as fencepost's store
                c = original(pool)
                c._sqlite_conn.execute(f"PRAGMA synchronous = {_ES_SQLITE_SYNC[0]}")
                return c

            SQLiteConnectionPool._create_connection = create_connection  # type: ignore[method-assign]
            _es_patched[0] = True

        Step = _step_class()
        self.app = Application(env=env)
        self.steps = [Step(f"fetch-{k}") for k in range(THREADS + 1)]
        for s in self.steps:
            self.app.save(s)
        self.i = 0

    def single(self, n: int) -> Sample:
        step = self.steps[THREADS]
        with Timer() as t:
            for _ in range(n):
                self.i += 1
                step.finish(_payload(self.i))
                self.app.save(step)
        return t.rate(n)

    def threaded(self, n: int) -> Sample:
        def work(k: int) -> None:
            step = self.steps[k]
            barrier.wait()
            for i in range(n):
                step.finish(_payload(i))
                self.app.save(step)

        return _run_threads(work, n)

    def close(self) -> None:
        self.app.close()


def _raw_single(raw: Any, n: int) -> Sample:
    with Timer() as t:
        for _ in range(n):
            raw.single()
    return t.rate(n)


def journal_rows(tmp: Path, pg: ScratchSchemas | None, reps: int, n: int, n_threaded: int) -> None:
    print("journal appends (appends/s)", flush=True)
    for sync in ("FULL", "NORMAL"):
        _ES_SQLITE_SYNC[0] = sync
        ours = FencepostAppends(f"sqlite:///{tmp / f'journal-{sync}.db'}?synchronous={sync}")
        es = EventSourcingAppends({"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                                   "SQLITE_DBNAME": str(tmp / f"es-{sync}.db")})
        a, b = interleaved(reps, lambda ours=ours: ours.single(n), lambda es=es: es.single(n))
        record("fenced append vs es Application.save", f"sqlite {sync}", "appends/s", a, b)
        # The ceiling of the row above: the raw driver inserting rows of the same size into the same
        # table, one BEGIN IMMEDIATE/INSERT/COMMIT each (no lookup, no hashing, no validation), vs the
        # peer. No store that writes one durable transaction per append gets past this ratio.
        (tmp / f"raw-{sync}").mkdir()
        raw = journal_bench.Raw(tmp / f"raw-{sync}", sync, (reps + 1) * n + 1)
        a, b = interleaved(reps, lambda raw=raw: _raw_single(raw, n), lambda es=es: es.single(n))
        record("raw sqlite3 insert (the ceiling) vs es Application.save", f"sqlite {sync}", "appends/s", a, b)
        raw.conn.close()
        if sync == "FULL":
            a, b = interleaved(reps, lambda ours=ours: ours.threaded(n_threaded),
                               lambda es=es: es.threaded(n_threaded))
            record(f"{THREADS} threads fenced append vs es save x{THREADS}", f"sqlite {sync}", "appends/s", a, b)
        ours.close()
        es.close()
    if pg is None:
        return
    _, ours_url = pg.new()
    es_schema, _ = pg.new()
    import psycopg

    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{es_schema}"')
    from sqlalchemy.engine import make_url

    u = make_url(pg.base_url)
    ours = FencepostAppends(ours_url)
    es = EventSourcingAppends({
        "PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": u.database or "postgres",
        "POSTGRES_HOST": u.host or "127.0.0.1", "POSTGRES_PORT": str(u.port or 5432),
        "POSTGRES_USER": u.username or "postgres", "POSTGRES_PASSWORD": u.password or "",
        "POSTGRES_SCHEMA": es_schema, "POSTGRES_POOL_SIZE": str(THREADS + 2),
    })
    pn = max(50, n // 5)
    a, b = interleaved(reps, lambda: ours.single(pn), lambda: es.single(pn))
    record("fenced append vs es Application.save", "postgresql", "appends/s", a, b)
    pt = max(20, n_threaded // 5)
    a, b = interleaved(reps, lambda: ours.threaded(pt), lambda: es.threaded(pt))
    record(f"{THREADS} threads fenced append vs es save x{THREADS}", "postgresql", "appends/s", a, b)
    ours.close()
    es.close()


# --------------------------------------------------------------------------- run-store hot path
def runstore_rows(tmp: Path, pg: ScratchSchemas | None, reps: int, runs: int) -> None:
    print("run-store hot path (runs/s, 5 write transactions each)", flush=True)
    counter = [0]

    def one(label: str, ours_url: str, raw_url: str, raw_connect: Callable[[], Any], kind: str,
            schema: str | None) -> None:
        clock = ManualClock(0)
        ours = fencepost.open(ours_url, clock=clock)
        raw_store = fencepost.open(raw_url, clock=clock)
        raw = rs_bench.Raw(kind, raw_connect(), schema)

        def run_ours() -> Sample:
            counter[0] += 1
            ids = rs_bench.seed(ours, f"o{counter[0]}", runs)
            quiet(ours)
            with Timer() as t:
                for rid in ids:
                    rs_bench.ours_one_run(ours, rid, 0)
                copy_log(ours)
            quiet(ours)
            return t.rate(runs)

        def run_raw() -> Sample:
            counter[0] += 1
            ids = rs_bench.seed(raw_store, f"r{counter[0]}", runs)
            quiet(raw_store)
            with Timer() as t:
                for rid in ids:
                    raw.one_run(rid, 0)
            return t.rate(runs)

        a, b = interleaved(reps, run_ours, run_raw)
        record("run-store hot path vs raw driver", label, "runs/s", a, b)
        ours.close()
        raw_store.close()
        raw.conn.close()

    for sync in ("FULL", "NORMAL"):
        a_path, b_path = tmp / f"rs-ours-{sync}.db", tmp / f"rs-raw-{sync}.db"

        def connect(path: Path = b_path, sync: str = sync) -> sqlite3.Connection:
            c = sqlite3.connect(path, isolation_level=None)
            c.execute("PRAGMA busy_timeout = 10000")
            c.execute("PRAGMA foreign_keys = ON")
            c.execute(f"PRAGMA synchronous = {sync}")
            return c

        one(f"sqlite {sync}", f"sqlite:///{a_path}?synchronous={sync}", f"sqlite:///{b_path}?synchronous={sync}",
            connect, "sqlite", None)
    if pg is not None:
        _, ours_url = pg.new()
        raw_schema, raw_url = pg.new()
        one("postgresql", ours_url, raw_url, lambda: pg.connect(raw_schema), "postgresql", raw_schema)


# --------------------------------------------------------------------------- change feed
def changefeed_rows(tmp: Path, pg: ScratchSchemas | None, reps: int, runs: int) -> None:
    print(f"changes_since pages of 500 over {runs:,} runs (changes/s)", flush=True)
    kinds = [("sqlite", None)] + ([("postgresql", pg.base_url)] if pg is not None else [])
    for kind, pg_url in kinds:
        store, _url, schema = cf_bench._open(kind, pg_url, tmp)
        try:
            cf_bench._fill(store, runs)
            cf_bench._analyze(store)

            def feed(store: fencepost.Store = store) -> Sample:
                with Timer() as t:
                    seen = cf_bench._feed_scan(store)
                assert seen == runs
                return t.rate(runs)

            def raw(store: fencepost.Store = store) -> Sample:
                with Timer() as t:
                    seen = cf_bench._raw_scan(store)
                assert seen == runs
                return t.rate(runs)

            a, b = interleaved(reps, feed, raw)
            record("changes_since(500) vs raw keyset scan", kind, "changes/s", a, b)
        finally:
            cf_bench._drop(store, schema)


# --------------------------------------------------------------------------- projection first build
_BASE_SELECT = ("SELECT r.run_id, r.status, c.revision FROM flows_runs r JOIN flows_run_changes c "
                "ON c.run_id = r.run_id")
_BASE_TABLE = "CREATE TABLE base_copy (run_id TEXT PRIMARY KEY, status TEXT NOT NULL, revision BIGINT NOT NULL)"


class _BuildFloor:
    """What a first build cannot do without, through the raw driver: per page of 500, the change
    page with its snapshots in one read transaction, then the read model's and the held revisions'
    upserts and a COMMIT on the target (SQLite: executemany; PostgreSQL: one JSON text each, as the
    builder sends them). No decoding or checks, no position read, no held-revision lookup, no
    checkpoint."""

    def __init__(self, source: fencepost.Store, runs: int) -> None:
        self.runs = runs
        self.source_id = source.feed.position().source
        self.projection = RunsByStatus()

    def prepare(self, target: Database) -> None:
        migrate(target, ("projections",))
        target.write(lambda conn: [t.create(conn) for t in self.projection.tables])

    def timed(self, src: Any, dst: Any, marker: str) -> Sample:
        """``run`` timed; closes both connections."""
        self.statements(marker)
        with Timer() as t:
            self.run(src, dst, marker)
        src.close()
        dst.close()
        return t.rate(self.runs)

    def run(self, src: Any, dst: Any, marker: str) -> None:
        done = 0
        for model_rows, held_rows in self.pages(src, marker):
            done += len(model_rows)
            self.write(dst, marker, model_rows, held_rows, last=done == self.runs)
        assert done == self.runs, done

    def writes_timed(self, pages: list[tuple[list, list]], dst: Any, marker: str) -> Sample:
        """Only the target's side of ``run`` (both upserts and a COMMIT per page), timed, for pages
        read beforehand; closes ``dst``."""
        with Timer() as t:
            for i, (model_rows, held_rows) in enumerate(pages):
                self.write(dst, marker, model_rows, held_rows, last=i == len(pages) - 1)
        dst.close()
        return t.rate(self.runs)

    def pages(self, src: Any, marker: str) -> Iterator[tuple[list, list]]:
        """Each page of 500 changes with their snapshots, read in its own transaction, as the rows of
        the read model and of the held revisions."""
        from fencepost.changefeed import _sql as feed_sql

        sqlite = marker == "?"
        dialect = (sqlite_dialect if sqlite else pg_dialect).dialect(paramstyle="qmark" if sqlite else "format")
        page_sql = str(feed_sql.CHANGES_WITH_RUNS.stmt.compile(dialect=dialect,
                                                               compile_kwargs={"render_postcompile": True}))
        # SQLite's LIMIT comes with an OFFSET parameter, PostgreSQL's does not.
        n_params = page_sql.count(marker)
        after = 0
        while True:
            if sqlite:
                src.execute("BEGIN")
            rows = src.execute(page_sql, (after, 2**53 - 1, 501, 0)[:n_params]).fetchall()
            src.execute("COMMIT") if sqlite else src.commit()
            page = rows[:500]
            yield ([(r[0], r[1], "bench", r[7], r[8], r[9], r[3], r[4], r[5], r[14], None, self.source_id, r[24])
                    for r in page],
                   [("runs_by_status", r[0], self.source_id, r[24]) for r in page])
            if len(rows) <= 500:
                break
            after = page[-1][24]

    def write(self, dst: Any, marker: str, model_rows: list, held_rows: list, *, last: bool) -> None:
        # As the builder: only the last page's COMMIT waits for the disk.
        if marker == "?":
            if not last:
                dst.execute("PRAGMA synchronous = NORMAL")
            dst.execute("BEGIN IMMEDIATE")
            dst.executemany(self._upserts[0], model_rows)
            dst.executemany(self._upserts[1], held_rows)
            dst.execute("COMMIT")
            if not last:
                dst.execute("PRAGMA synchronous = FULL")
        else:
            encode = msgspec.json.encode
            if not last:
                dst.execute("SET LOCAL synchronous_commit TO OFF")
            dst.execute(self._upserts[0], (encode([dict(zip(self._cols, r, strict=True))
                                                   for r in model_rows]).decode(),))
            dst.execute(self._upserts[1], (encode([{"name": r[0], "run_id": r[1], "source": r[2], "revision": r[3]}
                                                   for r in held_rows]).decode(),))
            dst.commit()

    def statements(self, marker: str) -> None:
        """The two upserts for ``marker``'s driver (SQLite: executemany; PostgreSQL: one JSON text)."""
        from fencepost.projections import _sql as proj_sql

        model = self.projection.table
        self._cols = [c.name for c in model.columns]
        assert self._cols[:3] == ["run_id", "status", "flow_name"] and self._cols[-2:] == ["source", "revision"]
        self._upserts = []
        for table, key in ((model, ("run_id",)), (proj_sql.run_revisions, ("name", "run_id"))):
            names = [c.name for c in table.columns]
            sets = ", ".join(f"{c} = excluded.{c}" for c in names if c not in key)
            if marker == "?":
                values = f"VALUES ({', '.join('?' * len(names))})"
            else:
                values = f"SELECT {', '.join(names)} FROM json_populate_recordset(NULL::{table.name}, %s::json)"
            self._upserts.append(f"INSERT INTO {table.name} ({', '.join(names)}) {values} "
                                 f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {sets}")


def build_rows(tmp: Path, pg: ScratchSchemas | None, reps: int, runs: int) -> None:
    print(f"RunsByStatus first build of {runs:,} runs into a fresh target (runs/s)", flush=True)
    counter = [0]
    # SQLite -> fresh SQLite file
    source = fencepost.open(f"sqlite:///{tmp / 'build-source.db'}")
    proj_bench._populate(source, runs)

    def ours_sqlite() -> Sample:
        counter[0] += 1
        target = Database(f"sqlite:///{tmp / f'build-target-{counter[0]}.db'}")
        migrate(target, ("projections",))
        with ProjectionBuilder(source, target, RunsByStatus()) as builder:
            with Timer() as t:
                done = builder.catch_up()
            rate = t.rate(runs)
        assert done.applied == runs, done
        target.dispose()
        return rate

    def base_sqlite() -> Sample:
        counter[0] += 1
        path = tmp / f"build-base-{counter[0]}.db"
        timer = Timer().__enter__()
        src = sqlite3.connect(source.db.path, isolation_level=None)
        dst = sqlite3.connect(path, isolation_level=None)
        dst.execute("PRAGMA journal_mode = WAL")
        dst.execute("PRAGMA synchronous = FULL")
        src.execute("BEGIN")
        rows = src.execute(_BASE_SELECT).fetchall()
        src.execute("COMMIT")
        dst.execute("BEGIN IMMEDIATE")
        dst.execute(_BASE_TABLE)
        dst.executemany("INSERT INTO base_copy VALUES (?, ?, ?)", rows)
        dst.execute("COMMIT")
        timer.__exit__()
        rate = timer.rate(runs)
        src.close()
        dst.close()
        assert len(rows) == runs
        return rate

    a, b = interleaved(reps, ours_sqlite, base_sqlite)
    record("RunsByStatus first build vs raw read+insert", "sqlite", "runs/s", a, b)
    floor = _BuildFloor(source, runs)

    def floor_target(kind: str) -> sqlite3.Connection:
        """A fresh target file with the builder's tables, as a raw FULL-synchronous connection."""
        counter[0] += 1
        target = Database(f"sqlite:///{tmp / f'build-{kind}-{counter[0]}.db'}")
        floor.prepare(target)
        path = target.path
        target.dispose()
        dst = sqlite3.connect(path, isolation_level=None)
        dst.execute("PRAGMA synchronous = FULL")
        return dst

    def floor_sqlite() -> Sample:
        dst = floor_target("floor")
        return floor.timed(sqlite3.connect(source.db.path, isolation_level=None), dst, "?")

    a, b = interleaved(reps, ours_sqlite, floor_sqlite)
    record("RunsByStatus first build vs raw, same statements", "sqlite", "runs/s", a, b)
    # The ceiling the two tables themselves set: only the target's writes of a build (pages read
    # beforehand, untimed) against the whole three-column copy, reading included.
    src = sqlite3.connect(source.db.path, isolation_level=None)
    floor.statements("?")
    pages = list(floor.pages(src, "?"))
    src.close()

    def writes_sqlite() -> Sample:
        return floor.writes_timed(pages, floor_target("writes"), "?")

    a, b = interleaved(reps, writes_sqlite, base_sqlite)
    record("raw writes of a first build only (no reads) vs raw read+insert", "sqlite", "runs/s", a, b)
    source.close()
    if pg is None:
        return
    # PostgreSQL -> fresh PostgreSQL schema
    src_schema, src_url = pg.new()
    source = fencepost.open(src_url)
    proj_bench._populate(source, runs)

    def ours_pg() -> Sample:
        _, url = pg.new()
        target = Database(url)
        migrate(target, ("projections",))
        with ProjectionBuilder(source, target, RunsByStatus()) as builder:
            with Timer() as t:
                done = builder.catch_up()
            rate = t.rate(runs)
        assert done.applied == runs, done
        target.dispose()
        return rate

    def base_pg() -> Sample:
        schema, _ = pg.new()
        timer = Timer().__enter__()
        src = pg.connect(src_schema)
        rows = src.execute(_BASE_SELECT).fetchall()
        src.commit()
        dst = pg.connect(schema)
        dst.execute(f'CREATE SCHEMA "{schema}"')
        dst.execute(f'SET search_path TO "{schema}"')
        dst.execute(_BASE_TABLE)
        with dst.cursor() as cur:
            cur.executemany("INSERT INTO base_copy VALUES (%s, %s, %s)", rows)
        dst.commit()
        timer.__exit__()
        rate = timer.rate(runs)
        src.close()
        dst.close()
        assert len(rows) == runs
        return rate

    a, b = interleaved(reps, ours_pg, base_pg)
    record("RunsByStatus first build vs raw read+insert", "postgresql", "runs/s", a, b)
    floor = _BuildFloor(source, runs)

    def floor_pg() -> Sample:
        schema, url = pg.new()
        target = Database(url)
        floor.prepare(target)
        target.dispose()
        src = pg.connect(src_schema)
        return floor.timed(src, pg.connect(schema), "%s")

    a, b = interleaved(reps, ours_pg, floor_pg)
    record("RunsByStatus first build vs raw, same statements", "postgresql", "runs/s", a, b)
    source.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", default=None, help="PostgreSQL URL (postgresql+psycopg://...) for the second backend")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--appends", type=int, default=1000, help="single-thread appends per rep (SQLite)")
    ap.add_argument("--thread-appends", type=int, default=250, help="appends per thread per rep (SQLite)")
    ap.add_argument("--runs", type=int, default=200, help="runs per rep through the run-store hot path")
    ap.add_argument("--feed-runs", type=int, default=50_000)
    ap.add_argument("--build-runs", type=int, default=20_000)
    ap.add_argument("--only", default="", help="comma list of: journal,runstore,feed,build")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(","))) or {"journal", "runstore", "feed", "build"}
    print(f"{args.reps} interleaved reps per row; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="fencepost-table-") as tmp_dir:
        tmp = Path(tmp_dir)
        pg_ctx = ScratchSchemas(args.pg) if args.pg else None
        try:
            if "journal" in only:
                journal_rows(tmp, pg_ctx, args.reps, args.appends, args.thread_appends)
            if "runstore" in only:
                runstore_rows(tmp, pg_ctx, args.reps, args.runs)
            if "feed" in only:
                changefeed_rows(tmp, pg_ctx, args.reps, args.feed_runs)
            if "build" in only:
                build_rows(tmp, pg_ctx, args.reps, args.build_runs)
        finally:
            if pg_ctx is not None:
                pg_ctx.__exit__(None, None, None)
    print("\n| path | backend | fencepost | baseline | median ratio | CPU-time ratio |\n|---|---|---|---|---|---|")
    for path, backend, ours, base, ratio, cpu, unit in ROWS:
        print(f"| {path} | {backend} | {ours:,.0f} {unit} | {base:,.0f} {unit} | {ratio:.2f}x | {cpu:.2f}x |")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
