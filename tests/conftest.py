"""Fixtures: every store test runs on SQLite and on PostgreSQL.

PostgreSQL comes from ``$FENCEPOST_TEST_POSTGRES_URL``; without it from testcontainers where Docker
runs; otherwise its tests are skipped with a reason, except under ``FENCEPOST_REQUIRE_POSTGRES=1``
(set by ``.ci/run``), where a missing server fails the run. Each PostgreSQL test gets its own schema.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

import fencepost
from fencepost.clock import ManualClock

_pg_state: dict[str, object] = {}


def postgres_container_class() -> type:
    """testcontainers' PostgreSQL container: from ``testcontainers.community`` where this version has
    it (importing ``testcontainers.postgres`` there warns that it is deprecated), else the old path."""
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        from testcontainers.postgres import PostgresContainer
    return PostgresContainer


def _postgres_base_url() -> str | None:
    if "url" in _pg_state:
        return _pg_state["url"]  # type: ignore[return-value]
    url = os.environ.get("FENCEPOST_TEST_POSTGRES_URL")
    if not url:
        try:
            container = postgres_container_class()("postgres:15", driver="psycopg")
            container.start()
            _pg_state["container"] = container
            url = container.get_connection_url()
        except Exception as exc:  # no Docker here: record why
            _pg_state["why"] = f"no FENCEPOST_TEST_POSTGRES_URL and testcontainers failed ({type(exc).__name__})"
            url = None
    if url and url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    _pg_state["url"] = url
    return url


def pytest_configure(config: pytest.Config) -> None:
    """A run started where SIGINT is ignored (a background job of a shell without job control, as
    ``cmd &`` in a script; ``nohup``) hands that to every process it starts, which then cannot be
    interrupted: the Ctrl-C tests would see their command run on to exit 0. Give this process
    Python's own handler instead, which a started program does not inherit (it gets the default)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _pg_state["exitstatus"] = int(exitstatus)
    container = _pg_state.get("container")
    if container is not None:
        container.stop()  # type: ignore[attr-defined]


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A test that leaves a non-daemon thread running would keep the interpreter from ever exiting.

    Give such threads a moment, then name them and end the process with a failing status, so a
    leaked thread is a reported defect rather than a run that never finishes.
    """
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    for t in left:
        t.join(timeout=10)
    left = [t for t in left if t.is_alive()]
    if not left:
        return
    names = ", ".join(sorted(t.name for t in left))
    sys.stderr.write(f"\nnon-daemon threads still running after the session (a test leaked them): {names}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(int(_pg_state.get("exitstatus", 1)) or 1)


def require_postgres() -> str:
    url = _postgres_base_url()
    if url is None:
        why = str(_pg_state.get("why", "no PostgreSQL server"))
        if os.environ.get("FENCEPOST_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required (FENCEPOST_REQUIRE_POSTGRES=1): {why}")
        pytest.skip(why)
    return url


def _with_schema(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}schema={schema}"


def store_exists(url: str) -> bool:
    """Whether the store at a test URL was created: its SQLite file, or its PostgreSQL schema."""
    if url.startswith("sqlite:"):
        return Path(url[len("sqlite:///"):]).exists()
    schema = url.rsplit("schema=", 1)[1]
    engine = create_engine(require_postgres(), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT 1 FROM pg_namespace WHERE nspname = :s"), {"s": schema}).first()
    finally:
        engine.dispose()
    return found is not None


def drop_schema(base_url: str, schema: str) -> None:
    """Drop a test's schema. A teardown's DROP ... CASCADE can lose a deadlock to another session
    still ending (a test's background thread, a session the server has not reaped yet): the server
    rolls the DROP back, and it is tried again, up to five times."""
    from sqlalchemy.exc import OperationalError

    engine = create_engine(base_url, poolclass=NullPool)
    try:
        for attempt in range(5):
            try:
                with engine.connect() as conn:
                    conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                    conn.commit()
                return
            except OperationalError as exc:
                if getattr(exc.orig, "sqlstate", None) != "40P01" or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def db_url(backend: str, tmp_path) -> Iterator[str]:
    """A URL for a fresh, empty database on ``backend``."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'flows.db'}"
        return
    base = require_postgres()
    schema = "t_" + uuid.uuid4().hex[:16]
    yield _with_schema(base, schema)
    drop_schema(base, schema)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL schema's URL on the test server (dropped afterwards), for tests that
    apply to PostgreSQL alone."""
    base = require_postgres()
    schema = "t_" + uuid.uuid4().hex[:16]
    yield _with_schema(base, schema)
    drop_schema(base, schema)


@pytest.fixture
def make_db_url(backend: str, tmp_path) -> Iterator:
    """A factory of fresh database URLs on ``backend`` (for tests that need two databases)."""
    made: list[str] = []

    def make(kind: str | None = None) -> str:
        kind = kind or backend
        if kind == "sqlite":
            return f"sqlite:///{tmp_path / ('db-' + uuid.uuid4().hex[:8] + '.db')}"
        base = require_postgres()
        schema = "t_" + uuid.uuid4().hex[:16]
        made.append(schema)
        return _with_schema(base, schema)

    yield make
    if made:
        base = require_postgres()
        for schema in made:
            drop_schema(base, schema)


_OTEL: dict[str, object] = {}


@pytest.fixture(scope="session")
def otel() -> dict[str, object]:
    """The OpenTelemetry SDK's tracer and meter providers with in-memory readers, installed once per
    process (the API takes one global provider of each): ``{"reader": ..., "exporter": ...}``."""
    if not _OTEL:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        exporter = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tp)
        _OTEL.update(reader=reader, exporter=exporter)
    return _OTEL


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0)


@pytest.fixture
def store(request: pytest.FixtureRequest, db_url: str, clock: ManualClock) -> Iterator[fencepost.Store]:
    # Indirect parametrization ``["group", "single"]`` runs a test with and without group commit.
    mode = getattr(request, "param", "group")
    s = fencepost.open(db_url, clock=clock, group_commit=mode == "group")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def raw(store: fencepost.Store):
    """A plain SQLAlchemy connection to the store's database (autobegin; call ``commit()``)."""
    conn = store.db.connect()
    try:
        yield conn
    finally:
        conn.close()


def back_to_4001(url: str) -> None:
    """Make the store at ``url`` look as the version before migration 4002 left it: forget the ledger
    rows of 4002, 4003 and 4004 and undo their effect (the ``founded_at_ms`` column of
    ``flows_shard_membership``, and 4004's bounds)."""
    from fencepost._durable import Database

    db = Database(url)
    try:
        _undo_4004(db, upto=4001)
        db.write(lambda conn: conn.exec_driver_sql("DELETE FROM flows_migrations WHERE migration_id IN (4002, 4003)"))
        if db.backend.name == "postgresql":  # SQLite: the table is already made as 4001 made it
            db.write(lambda conn: conn.exec_driver_sql("ALTER TABLE flows_shard_membership DROP COLUMN founded_at_ms"))
    finally:
        db.dispose()


def back_to_4002_unmarked(url: str) -> None:
    """Make the store at ``url`` look as the version with migration 4002 (and without 4003) left a
    store that no open of its whole set marked: forget 4003's and 4004's ledger rows, undo 4004's
    bounds, clear ``founded_at_ms``."""
    from fencepost._durable import Database

    db = Database(url)
    try:
        _undo_4004(db, upto=4002)
        db.write(lambda conn: conn.exec_driver_sql("DELETE FROM flows_migrations WHERE migration_id = 4003"))
        db.write(lambda conn: conn.exec_driver_sql("UPDATE flows_shard_membership SET founded_at_ms = NULL"))
    finally:
        db.dispose()


def back_to_4003(url: str) -> None:
    """Make the store at ``url`` look as the version before migration 4004 left it: forget 4004's
    ledger row and undo its bounds on ``generation`` and ``joined_at_ms``."""
    from fencepost._durable import Database

    db = Database(url)
    try:
        _undo_4004(db, upto=4003)
    finally:
        db.dispose()


def _undo_4004(db, *, upto: int) -> None:
    """Undo migration 4004 and forget it. PostgreSQL: drop its constraint. SQLite: make the table
    again with the statements of 4001 (and 4002's column, for ``upto`` 4002 or later), rows kept."""
    from fencepost._migrations import applied, discover

    if 4004 not in applied(db):
        return
    if db.backend.name == "postgresql":
        db.write(lambda conn: conn.exec_driver_sql(
            "ALTER TABLE flows_shard_membership DROP CONSTRAINT flows_shard_membership_safe_integers"))
    else:
        scripts = {m.id: m.script for m in discover("sqlite") if m.id in (4001, 4002) and m.id <= upto}
        columns = "singleton, set_id, shard_name, members_json, generation, joined_at_ms" + (
            ", founded_at_ms" if upto >= 4002 else "")

        def body(conn) -> None:
            conn.exec_driver_sql("ALTER TABLE flows_shard_membership RENAME TO flows_shard_membership_4004")
            for mid in sorted(scripts):
                for statement in db.backend.split_script(scripts[mid]):
                    conn.exec_driver_sql(statement)
            conn.exec_driver_sql(f"INSERT INTO flows_shard_membership ({columns}) "
                                 f"SELECT {columns} FROM flows_shard_membership_4004")
            conn.exec_driver_sql("DROP TABLE flows_shard_membership_4004")

        db.write(body)
    db.write(lambda conn: conn.exec_driver_sql("DELETE FROM flows_migrations WHERE migration_id = 4004"))


def ledger_of(url: str) -> set[int]:
    """The migration ids the store at ``url`` records as applied (read without opening it as a store)."""
    from fencepost._durable import Database
    from fencepost._migrations import applied

    db = Database(url, readonly=True)
    try:
        return set(applied(db))
    finally:
        db.dispose()


def run_forked(child: Callable[[], object], *, parent: Callable[[], object] | None = None,
               timeout: float | None = None) -> int:
    """Run ``child()`` in a forked process and wait for it: its exit status (0 = it returned; 1 =
    it raised, its traceback printed with the test's output). The child leaves by ``os._exit``,
    never through the parent's cleanups.

    ``parent()`` runs in the parent right after the fork, before the wait (release what the child
    must find held, close a pipe's other end, read what the child writes). ``timeout``: a child
    still running after that many seconds is killed, and ``TimeoutError`` raised."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        code = 1
        try:
            child()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    try:
        if parent is not None:
            parent()
    finally:
        if timeout is None:
            _, status = os.waitpid(pid, 0)
        else:
            deadline = time.monotonic() + timeout
            while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            if done[0] == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise TimeoutError(f"the forked child did not end within {timeout:g} s")
            status = done[1]
    return os.waitstatus_to_exitcode(status)


def run_in_background(fn: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """``fn()`` on a started daemon thread: the thread, and a list that gets the exception that
    ended ``fn`` (empty while it runs or when it returned)."""
    failed: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # the caller asserts on it
            failed.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, failed


def race_threads(calls: Sequence[Callable[[], object]], *,
                 catch: type[BaseException] | tuple[type[BaseException], ...] = BaseException,
                 join_s: float = 60) -> list:
    """Run each of ``calls`` on its own thread, all released together at one barrier: what each call
    returned, or the ``catch`` error it raised, in the order of ``calls``. Fails when a thread is still
    running ``join_s`` seconds after the release."""
    barrier = threading.Barrier(len(calls))
    out: list = [None] * len(calls)

    def body(i: int) -> None:
        barrier.wait(30)
        try:
            out[i] = calls[i]()
        except catch as exc:  # asserted by the caller
            out[i] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    assert not any(t.is_alive() for t in threads)
    return out


def race_processes(target: Callable[..., object], args_of: Callable[[int], tuple], n: int, *,
                   start_method: str = "spawn", timeout: float = 120) -> tuple[list, list[int | None]]:
    """Start ``n`` processes ``target(*args_of(i), barrier, out)`` that share one barrier of ``n``
    and one queue, and wait for them: the ``n`` values they put on ``out`` (in arrival order, each
    awaited at most ``timeout`` seconds) and their exit codes. A process still running after 60 s
    more is killed. ``start_method="fork"`` only where the parent holds no open store."""
    ctx = mp.get_context(start_method)
    barrier = ctx.Barrier(n)
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(i), barrier, out)) for i in range(n)]
    try:
        for p in procs:
            p.start()
        results = [out.get(timeout=timeout) for _ in procs]
        for p in procs:
            p.join(60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return results, [p.exitcode for p in procs]


class SilentServer:
    """A TCP port that refuses connections until ``listen()``, then accepts them and never sends a
    byte (a host that swallows traffic): the connections it took (``held``) stay open until
    ``close()``; ``reached`` is set at the first."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        self.reached = threading.Event()
        self.thread: threading.Thread | None = None

    def listen(self) -> None:
        self.sock.listen(64)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            self._took(conn)
            self.reached.set()

    def _took(self, conn: socket.socket) -> None:
        """What is done with a connection taken (here: nothing, it stays silent)."""

    def still_held(self, index: int = 0) -> bool:
        """Whether connection ``index`` (the first by default) is still open at the client's end: what
        the client sent (libpq's first request) is read away, then no end of file yet. (A peek alone
        would see that unread request, not a close behind it.)"""
        conn = self.held[index]
        conn.setblocking(False)
        try:
            while True:
                if conn.recv(4096) == b"":
                    return False
        except BlockingIOError:
            return True

    def close(self) -> None:
        # Closing a listening socket does not wake a thread blocked in its accept() (Linux); a
        # shutdown does, at once, instead of after the join's whole timeout.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not listening (never was, or already shut down)
        self.sock.close()
        if self.thread is not None:
            self.thread.join(5)
        for conn in self.held:
            conn.close()


def settle_many(store: fencepost.Store, start: int, n: int) -> None:
    """Insert ``n`` completed runs (``done-NNNNNN`` from ``start``) straight into the run table, in one
    transaction: a large store for the cost tests, without the run store's per-run writes."""
    marker = "?" if store.db.name == "sqlite" else "%s"
    store.db.write(lambda conn: conn.exec_driver_sql(
        "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms, finished_at_ms) "
        f"VALUES ({marker}, 'completed', '{{}}', {marker}, {marker})",
        [(f"done-{i:06d}", i, i + 1) for i in range(start, start + n)]))


def sqlite_instructions(store: fencepost.Store, work: Callable[[Any], object]) -> int:
    """SQLite: the virtual machine instructions ``work(raw sqlite3 connection)`` executes, counted by
    a progress handler on a connection of ``store``: a measure of how much a statement reads that
    no clock and no machine load moves."""

    def count(conn: Any) -> int:
        raw = conn.connection.dbapi_connection
        steps = [0]

        def tick() -> int:
            steps[0] += 1
            return 0

        raw.set_progress_handler(tick, 1)
        try:
            work(raw)
        finally:
            raw.set_progress_handler(None, 1)
        return steps[0]

    return store.db.read(count)


def replayed_instructions(store: fencepost.Store, statements: list[tuple[str, Any]]) -> int:
    """SQLite: ``sqlite_instructions`` of the captured ``(sql, params)`` SELECTs of ``statements``, run again."""
    return sqlite_instructions(store, lambda raw: [raw.execute(sql, params).fetchall() for sql, params in statements
                                                   if sql.lstrip().upper().startswith("SELECT")])


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a PostgreSQL ``EXPLAIN (FORMAT JSON)`` plan, the root first."""
    nodes: list[dict[str, Any]] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.get("Plans", []))
    return nodes


def scanned_rows(nodes: list[dict[str, Any]]) -> int:
    """The rows a plan's scans produced or filtered out: how much a statement read."""
    return sum(int(node["Actual Rows"]) + int(node.get("Rows Removed by Filter", 0))
               for node in nodes if "Scan" in node["Node Type"])


def pg_plan_nodes(store: fencepost.Store, sql: str, params: Any) -> list[dict[str, Any]]:
    """PostgreSQL: every node of the plan ``EXPLAIN (ANALYZE)`` ran for ``sql`` with ``params`` on a
    connection of ``store``, each with its "Node Type", "Actual Rows" and the rest: how many rows a
    statement read, counted rather than timed."""

    def explain(conn: Any) -> Any:
        cur = conn.connection.dbapi_connection.cursor()
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        return cur.fetchone()[0]

    return plan_nodes(store.db.read(explain)[0]["Plan"])


def pg_rows_read(store: fencepost.Store, statements: list[tuple[str, Any]]) -> int:
    """PostgreSQL: ``scanned_rows`` over the plans of every captured ``(sql, params)``, each explained alone."""
    return sum(scanned_rows(pg_plan_nodes(store, sql, params)) for sql, params in statements)


def eventually(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """Whether ``predicate()`` became true within ``timeout`` seconds (polled every 10 ms): what a
    test waits on instead of a sleep, for something a background thread or process does."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def verified_positions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The positions of the journal entries a verification checks while the test runs (every
    ``verify`` pass and the console's), in order: how much a pass read, counted."""
    from fencepost.journal.verify import _Checker

    seen: list[int] = []
    check = _Checker.check

    def counted(self: Any, row: Any) -> None:
        seen.append(int(row.position))
        check(self, row)

    monkeypatch.setattr(_Checker, "check", counted)
    return seen
