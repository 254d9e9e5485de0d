"""Migration 3005 applied to a projection target that already holds a projection, under real faults.

The target is as the version before 3005 left it: a projection of a few thousand runs, one row in
the rebuild log, and a rebuild in progress (its shadow holds one page of held revisions). 3005
copies the builder's four tables into bounded twins on SQLite and adds CHECKs in place on
PostgreSQL, inside the one write transaction of the builder's migration pass. Each test's docstring
names its fault. What every test proves:

- nothing partial: after the fault the target is exactly as before (every row of the builder's
  tables and of the projection's, its schema, and a ledger without 3005), and a read-only status
  reads the same as before;
- the next builder opened on it applies 3005, and its ``catch_up`` (which finishes the rebuild in
  progress) returns what it returns on a twin target that never saw the fault, leaving the same rows.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

import fencepost
from fencepost import _migrations
from fencepost._durable import Database, DbFailure
from fencepost.errors import ProjectionError
from fencepost.projections import OwnershipHistory, ProjectionBuilder, RunsByStatus
from tests.conftest import ledger_of, require_postgres
from tests.faults.conftest import REPO, Peer, assert_value_free
from tests.projections import _runs

pytestmark = pytest.mark.slow

RUNS = 2000
BATCH = 250
# Where a child stops in the middle of 3005, after the statement holding this. SQLite: the held
# revisions' bounded twin renamed into place (the checkpoints and the rebuild log already swapped,
# the shadow's revisions not yet). PostgreSQL runs a script as one statement: all four CHECKs added,
# the ledger row not yet written, nothing committed.
MIDDLE = {"sqlite": "ALTER TABLE projection_run_revisions_v3 RENAME",
          "postgresql": "ADD CONSTRAINT projection_run_revisions_shadow_safe_revision"}
BUILDER_TABLES = ("projection_checkpoints", "projection_rebuilds", "projection_run_revisions",
                  "projection_run_revisions_shadow")
TABLES = (*BUILDER_TABLES, "projection_runs_by_status", "projection_runs_by_status__shadow")
# Stamps of the clock: two twin targets built one after the other differ only in these.
STAMPS = {"updated_at_ms", "shadow_started_at_ms", "started_at_ms", "finished_at_ms"}


class _Stop(Exception):
    pass


def _seed(store: fencepost.Store) -> None:
    def body(conn: Any) -> None:
        for i in range(RUNS):
            _runs.create(conn, f"run-{i:05d}", i)
        for i in range(0, RUNS, 7):
            _runs.start(conn, f"run-{i:05d}", RUNS + i)

    store.db.write(body)


def _more(store: fencepost.Store) -> None:
    """Changes made after the targets were built: the catch-up after 3005 applies them too."""
    def body(conn: Any) -> None:
        for i in range(0, RUNS, 7):
            _runs.settle(conn, f"run-{i:05d}", "completed", 2 * RUNS + i)
        for i in range(40):
            _runs.create(conn, f"late-{i:03d}", 3 * RUNS + i)

    store.db.write(body)


def build_old(store: fencepost.Store, target: str) -> None:
    """A target as the version before 3005 left it (built by today's builder, whose rows fit the
    old tables): caught up, rebuilt once, and a second rebuild stopped after its first shadow page."""
    shipped = _migrations.discover
    patch = pytest.MonkeyPatch()
    patch.setattr(_migrations, "discover", lambda *a, **k: [m for m in shipped(*a, **k) if m.id != 3005])
    try:
        with ProjectionBuilder(store, target, RunsByStatus(), batch_size=BATCH) as builder:
            builder.catch_up()
            builder.rebuild()

            def stop(shadow: bool, page: Any) -> None:
                if shadow:
                    raise _Stop

            builder._after_page = stop
            with pytest.raises(_Stop):
                builder.rebuild()
            builder._after_page = None
    finally:
        patch.undo()
    assert {3004, 3005} & ledger_of(target) == {3004}


def _checkpoint_wal(url: str) -> None:
    if url.startswith("sqlite:"):
        with sqlite3.connect(_path(url)) as raw:
            assert raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0


def _path(url: str) -> str:
    return url[len("sqlite:///"):].split("?")[0]


def snapshot(url: str) -> dict[str, Any]:
    """Everything 3005 could touch: every row of the builder's and the projection's tables, the
    schema (SQLite: ``sqlite_master`` and ``sqlite_sequence``; PostgreSQL: the constraints) and the ledger."""
    db = Database(url, readonly=True)
    try:
        def read(conn: Any) -> dict[str, Any]:
            found: dict[str, Any] = {t: sorted(tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {t}"))
                                     for t in TABLES}
            found["ledger"] = sorted(tuple(r) for r in conn.exec_driver_sql(
                "SELECT migration_id, name FROM flows_migrations"))
            if db.backend.name == "sqlite":
                found["schema"] = sorted(tuple(r) for r in conn.exec_driver_sql(
                    "SELECT type, name, tbl_name, rootpage, sql FROM sqlite_master"))
                found["sequence"] = sorted(tuple(r) for r in conn.exec_driver_sql("SELECT * FROM sqlite_sequence"))
            else:
                found["schema"] = sorted(tuple(r) for r in conn.execute(text(
                    "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
                    "JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = :s"), {"s": db.schema}))
            return found

        return db.read(read)
    finally:
        db.dispose()


def comparable(url: str, name: str = "runs_by_status") -> dict[str, Any]:
    """The rows of ``snapshot`` by column name, less the clock's stamps (what twin targets share),
    of the projection ``name`` only."""
    db = Database(url, readonly=True)
    try:
        def read(conn: Any) -> dict[str, Any]:
            found = {}
            for t in TABLES:
                result = conn.exec_driver_sql(f"SELECT * FROM {t}")
                keys = list(result.keys())
                rows = [dict(zip(keys, row, strict=True)) for row in result]
                found[t] = sorted(tuple(sorted((k, v) for k, v in row.items() if k not in STAMPS))
                                  for row in rows if row.get("name", name) == name)
            return found

        return db.read(read)
    finally:
        db.dispose()


def read_only_status(store: fencepost.Store, url: str) -> Any:
    """``status()`` through a read-only target, as ``fencepost projection status`` reads it."""
    db = Database(url, readonly=True)
    try:
        with ProjectionBuilder(store, db, RunsByStatus()) as reader:
            return reader.status()
    finally:
        db.dispose()


def _unstamped(status: Any) -> tuple:
    record = status.last_rebuild
    return (status.name, status.feed, status.source, status.applied_revision, status.source_revision, status.lag,
            status.applied, status.rejected, status.rebuilds, status.pending_rebuild,
            None if record is None else (record.reason, record.from_source, record.from_revision, record.to_source,
                                         record.to_revision, record.applied))


class Old:
    """A source store, an old target and its twin (built the same way, never faulted)."""

    def __init__(self, store: fencepost.Store, source_url: str, target: str, twin: str, *,
                 built: bool = False) -> None:
        """Seed the source and build both targets, or take them as built already (``built``)."""
        self.store, self.source_url, self.target, self.twin = store, source_url, target, twin
        if not built:
            _seed(store)
            build_old(store, target)
            if target.startswith("sqlite:"):
                _checkpoint_wal(target)
                shutil.copyfile(_path(target), _path(twin))  # the very same bytes
            else:
                build_old(store, twin)
        self.before = snapshot(target)
        self.status = read_only_status(store, target)
        assert self.status.pending_rebuild == "requested" and self.status.rebuilds == 1
        assert len(self.before["projection_run_revisions"]) == RUNS
        assert len(self.before["projection_run_revisions_shadow"]) == BATCH
        assert len(self.before["projection_rebuilds"]) == 1

    def assert_untouched(self) -> None:
        """Nothing of 3005 is left: the target is as it was, read-only status included."""
        assert snapshot(self.target) == self.before
        assert 3005 not in ledger_of(self.target)
        assert read_only_status(self.store, self.target) == self.status

    def finish_twin(self) -> tuple[Any, Any]:
        """The twin's catch-up after 3005, never faulted: what the faulted target must do the same."""
        with ProjectionBuilder(self.store, self.twin, RunsByStatus(), batch_size=BATCH) as twin:
            return twin.catch_up(), twin.status()

    def assert_resumed(self, done: Any, status: Any) -> None:
        """The faulted target, migrated since, did what its twin does, and reflects the source."""
        assert 3005 in ledger_of(self.target)
        expected, expected_status = self.finish_twin()
        assert expected.rebuilt is True and expected.applied > 0
        assert done == expected
        assert _unstamped(status) == _unstamped(expected_status)
        assert status.lag == 0 and status.pending_rebuild is None and status.rebuilds == 2
        assert comparable(self.target) == comparable(self.twin)
        db = Database(self.target, readonly=True)
        try:
            assert db.read(_runs.projected_rows) == self.store.db.read(_runs.live_rows)
        finally:
            db.dispose()
        # Bounded now: a held revision past 2^53 - 1 is refused by the database.
        db = Database(self.target)
        try:
            with pytest.raises(Exception, match="constraint"):
                db.write(lambda conn: conn.exec_driver_sql(
                    "UPDATE projection_run_revisions SET revision = 9007199254740992"))
        finally:
            db.dispose()


@pytest.fixture
def old(backend: str, make_db_url) -> Iterator[Old]:
    source_url = make_db_url()
    store = fencepost.open(source_url)
    try:
        yield Old(store, source_url, make_db_url(), make_db_url())
    finally:
        store.close()


class Child:
    """A builder in another process (``tests/faults/_projection_migrating.py``)."""

    def __init__(self, source_url: str, target: str, projection: str = "runs_by_status", pause: str = "",
                 cache_pages: int | None = None) -> None:
        args = [source_url, target, projection, pause] + ([str(cache_pages)] if cache_pages else [])
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.faults._projection_migrating", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO)
        self._reader = Peer.__new__(Peer)  # the peer's bounded line reader on this pipe
        self._reader.proc, self._reader._buf = self.proc, b""

    def line(self, timeout: float = 60) -> str:
        line = self._reader._line(timeout)
        assert line is not None, f"the child did not answer (exit code {self.proc.poll()})"
        return line

    def go_on(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=10) == -signal.SIGKILL

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def _caught_up(line: str) -> tuple:
    word, applied, rejected, rebuilt, revision = line.split()
    assert word == "caught_up", line
    return int(applied), int(rejected), rebuilt == "True", int(revision)


def _pg_wait_gone(pid: int) -> None:
    """Wait (bounded) until the killed client's server process has ended, its transaction rolled back."""
    engine = create_engine(require_postgres(), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            deadline = time.monotonic() + 20
            while conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).scalar():
                assert time.monotonic() < deadline, "the killed client's server process did not end"
                time.sleep(0.05)
    finally:
        engine.dispose()


def test_sigkill_in_the_middle_of_3005_leaves_the_old_target_and_the_next_builder_applies_it(
        old: Old, backend: str) -> None:
    """SIGKILL x migration 3005 on a target holding a projection (SQLite and PostgreSQL). The child
    builder is stopped right after a statement in the middle of 3005 (SQLite: three of the four
    tables already swapped for their bounded twins, its small page cache having spilled the
    uncommitted pages into the log file; PostgreSQL: the four CHECKs added, the ledger row not yet
    written) and killed."""
    wal = Path(_path(old.target) + "-wal") if backend == "sqlite" else None
    wal_before = wal.stat().st_size if wal is not None and wal.exists() else 0
    child = Child(old.source_url, old.target, pause=MIDDLE[backend], cache_pages=8 if backend == "sqlite" else None)
    try:
        assert child.line() == "pending 3005"
        paused = child.line()
        assert paused.startswith("paused "), paused
        if wal is not None:
            assert wal.stat().st_size > wal_before + 64 * 1024, "the copy's pages never reached the log file"
        child.kill()
    finally:
        child.close()
    if backend == "postgresql":
        _pg_wait_gone(int(paused.split()[1]))
    old.assert_untouched()

    _more(old.store)
    with ProjectionBuilder(old.store, old.target, RunsByStatus(), batch_size=BATCH) as builder:  # lock_timeout 0
        done = builder.catch_up()
        status = builder.status()
    old.assert_resumed(done, status)


@pytest.mark.parametrize("backend", ["postgresql"])
def test_sigkill_while_3005_waits_for_a_reader_s_lock(old: Old, backend: str) -> None:
    """SIGKILL x migration 3005 blocked by a table lock (PostgreSQL only: on SQLite a reader holds no
    lock a write waits for). A reader's open transaction on the shadow's held revisions holds the
    ``ALTER TABLE`` of 3005 there, after the three other CHECKs were added: no hook in the child. The
    child is killed while it waits; the reader then ends, so the orphaned server process goes on
    until it finds its client gone."""
    schema = old.target.rsplit("schema=", 1)[1]
    engine = create_engine(require_postgres(), poolclass=NullPool)
    child = None
    try:
        with engine.connect() as reader:
            reader.execute(text(f'SELECT count(*) FROM "{schema}".projection_run_revisions_shadow')).scalar()
            child = Child(old.source_url, old.target)
            assert child.line() == "pending 3005"
            with engine.connect() as watcher:
                deadline = time.monotonic() + 30
                while True:
                    waiting = watcher.execute(text(
                        "SELECT pid FROM pg_locks WHERE NOT granted AND relation = CAST(:t AS regclass)"),
                        {"t": f'"{schema}".projection_run_revisions_shadow'}).scalars().all()
                    if waiting:
                        break
                    assert time.monotonic() < deadline, "the migration never waited for the reader's lock"
                    time.sleep(0.05)
                done = watcher.execute(text(
                    "SELECT count(*) FROM pg_locks WHERE pid = :p AND granted AND mode = 'AccessExclusiveLock' "
                    "AND relation IS NOT NULL"), {"p": waiting[0]}).scalar()
                assert done >= 3  # the three other tables' CHECKs are in, uncommitted
            child.kill()
            reader.rollback()  # the reader ends: the orphaned ALTER TABLE gets its lock
        _pg_wait_gone(waiting[0])
    finally:
        if child is not None:
            child.close()
        engine.dispose()
    old.assert_untouched()

    _more(old.store)
    with ProjectionBuilder(old.store, old.target, RunsByStatus(), batch_size=BATCH) as builder:
        done_ = builder.catch_up()
        status = builder.status()
    old.assert_resumed(done_, status)


def test_two_builder_processes_opening_the_old_target_at_once_apply_3005_once(old: Old, backend: str) -> None:
    """Two builders (separate processes, two projections) opening the same old target at once
    (SQLite and PostgreSQL). The first is held in the middle of 3005 until the second has read the
    ledger (3005 pending) and waits for the write lock (PostgreSQL: seen waiting; SQLite, whose busy
    wait shows nowhere: given half a second to reach it); then the first goes on. Exactly one
    applies 3005, the other finds it applied under the lock; both then catch up."""
    _more(old.store)
    first = Child(old.source_url, old.target, "runs_by_status", pause=MIDDLE[backend])
    second = None
    try:
        assert first.line() == "pending 3005"
        assert first.line().startswith("paused ")
        second = Child(old.source_url, old.target, "ownership_history")
        assert second.line() == "pending 3005"
        if backend == "postgresql":  # the second waits for the write lock (an advisory lock)
            engine = create_engine(require_postgres(), poolclass=NullPool)
            try:
                with engine.connect() as watcher:
                    deadline = time.monotonic() + 30
                    while not watcher.execute(text(
                            "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'advisory'")).scalar():
                        assert time.monotonic() < deadline, "the second builder never waited for the write lock"
                        time.sleep(0.05)
            finally:
                engine.dispose()
        else:
            time.sleep(0.5)  # in its BEGIN IMMEDIATE (SQLite's busy handler shows nothing outside)
        first.go_on()
        lines = {"first": [first.line(), first.line()], "second": [second.line(), second.line()]}
        assert first.proc.wait(timeout=30) == 0 and second.proc.wait(timeout=30) == 0
    finally:
        first.close()
        if second is not None:
            second.close()
    migrated = sorted(lines[k][0] for k in lines)
    assert migrated == ["migrated -", "migrated 3005"], lines
    assert lines["first"][0] == "migrated 3005"  # the one held in the middle of it
    assert _caught_up(lines["second"][1])[2] is False  # built anew, no rebuild (its feed: the journal)
    expected, _status = old.finish_twin()
    assert _caught_up(lines["first"][1]) == (expected.applied, expected.rejected, expected.rebuilt, expected.revision)
    assert comparable(old.target) == comparable(old.twin)
    with ProjectionBuilder(old.store, old.target, OwnershipHistory()) as history:
        assert history.status().lag == 0
    assert [m for m in snapshot(old.target)["ledger"] if m[0] == 3005] == [(3005, "projections_safe_integers")]


@pytest.mark.parametrize("room", [48 * 1024, 160 * 1024, 320 * 1024])
def test_a_full_disk_during_3005_leaves_the_old_target_and_the_same_builder_applies_it_later(
        small_disk, tmp_path: Path, room: int) -> None:
    """Full disk x migration 3005 (SQLite: its copy into bounded twins needs room for the copied
    pages, about 370 KiB in the log here; the disk has room for a part of it, failing at the copy's
    start, middle or end). The builder's ``catch_up`` fails with ``disk_full`` / ``SQLITE_FULL``
    (as any failure preparing the target is named), nothing of 3005 is left, and once space is back
    the SAME builder applies 3005 and catches up. PostgreSQL: see the next test."""
    if not small_disk.mounted:
        pytest.skip("needs a tmpfs: the page cap is a hook on a store, and the target is no store")
    source_url = f"sqlite:///{tmp_path / 'flows.db'}"
    built = f"sqlite:///{tmp_path / 'built.db'}"
    twin = f"sqlite:///{tmp_path / 'twin.db'}"
    with fencepost.open(source_url) as store:
        Old(store, source_url, built, twin)
        # The old target on the small disk: the very bytes of its twin's.
        shutil.copyfile(_path(built), small_disk.root / "projection.db")
        # SQLite's own checkpoints (no background thread): the log's room is given back only when
        # the test says so.
        target = small_disk.url("projection.db") + "?checkpoints=writer"
        old = Old(store, source_url, target, twin, built=True)
        _checkpoint_wal(target)
        ran: list[str] = []

        def witness(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "projection_checkpoints_v2" in statement:
                ran.append(statement)

        with ProjectionBuilder(store, target, RunsByStatus(), batch_size=BATCH) as builder:
            small_disk.fill_leaving(room)
            event.listen(Engine, "after_cursor_execute", witness)
            try:
                with pytest.raises(ProjectionError) as caught:
                    builder.catch_up()
                event.remove(Engine, "after_cursor_execute", witness)
                assert ran, "the pass failed before 3005 began"
                # Named as for an open: the builder's migration pass is part of preparing its target.
                assert caught.value.code == "disk_full", caught.value
                assert "Projection.prepare: " in str(caught.value), caught.value
                assert getattr(caught.value, "db_code", None) == "SQLITE_FULL", caught.value
                assert_value_free(caught.value)
                old.assert_untouched()
            finally:
                if event.contains(Engine, "after_cursor_execute", witness):
                    event.remove(Engine, "after_cursor_execute", witness)
                small_disk.free()
            _more(store)
            done = builder.catch_up()  # the SAME builder
            status = builder.status()
        old.assert_resumed(done, status)


def test_read_only_projection_status_reads_a_target_without_3005(old: Old, run_cli) -> None:
    """``fencepost projection status`` (read-only on both sides) on a target that lacks 3005 (SQLite
    and PostgreSQL): it answers what the library's status says and writes nothing (3005 stays
    pending, every row and the schema as they were)."""
    import json

    shown = json.loads(run_cli("--db", old.source_url, "projection", "status", "--target", old.target,
                               "--json").out)
    assert (shown["applied_revision"], shown["lag"], shown["rebuilds"], shown["pending_rebuild"]) == (
        old.status.applied_revision, old.status.lag, 1, "requested")
    assert shown["applied"] == old.status.applied and shown["rejected"] == old.status.rejected
    old.assert_untouched()



def test_3005_needs_no_room_in_a_full_postgresql_tablespace(full_disk_server, tmp_path: Path) -> None:
    """Full disk x migration 3005 on PostgreSQL (a private server whose tables live on a small tmpfs;
    SQLite: the test above). 3005 adds its CHECKs in place: it scans the tables and writes catalog
    rows only (in the database's own tablespace, not the full one), so it applies on a target whose
    disk is full, every row as it was; once space is back the builder catches up as on a twin."""
    from tests.conftest import _with_schema, drop_schema

    source_url = f"sqlite:///{tmp_path / 'flows.db'}"
    target = full_disk_server.url
    twin_schema = "t_" + uuid.uuid4().hex[:16]
    twin = _with_schema(require_postgres(), twin_schema)
    try:
        with fencepost.open(source_url) as store:
            old = Old(store, source_url, target, twin)
            full_disk_server.fill()
            try:
                db = Database(target)
                try:
                    assert _migrations.migrate(db, ("projections",)) == [3005]
                finally:
                    db.dispose()
                after = snapshot(target)
                assert {k: v for k, v in after.items() if k not in ("ledger", "schema")} == \
                    {k: v for k, v in old.before.items() if k not in ("ledger", "schema")}
                assert len(after["schema"]) == len(old.before["schema"]) + 4  # the four CHECKs
                db = Database(target)
                try:  # the disk is full indeed: rows that need a new page are refused
                    with pytest.raises(DbFailure) as full:
                        db.write(lambda conn: conn.exec_driver_sql(
                            "INSERT INTO projection_run_revisions_shadow (name, run_id, source, revision) "
                            "SELECT 'x', md5(i::text) || repeat(md5(random()::text), 60), 'x', i "
                            "FROM generate_series(1, 200) AS i"))
                    assert full.value.code == "53100", full.value
                finally:
                    db.dispose()
            finally:
                full_disk_server.free()
            _more(store)
            with ProjectionBuilder(store, target, RunsByStatus(), batch_size=BATCH) as builder:
                done = builder.catch_up()
                status = builder.status()
            old.assert_resumed(done, status)
    finally:
        drop_schema(require_postgres(), twin_schema)
