"""A read-only open that is refused leaves the database exactly as it found it.

SQLite: no ``-wal``/``-shm`` file appears beside the user's file, and the file keeps its size,
modification time and journal mode (a listing of the directory with sizes and modification times
is the same before and after). PostgreSQL: no schema or table appears. Read CLI commands open
read-only, so they are checked too (SQLite: files are what a refused open could leave there).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

import fencepost


def _listing(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


def _journal_mode(path: Path) -> str:
    """From the file's header (bytes 18 and 19: 2 for WAL), without opening it."""
    with open(path, "rb") as f:
        header = f.read(20)
    return "wal" if header[18:20] == b"\x02\x02" else "rollback"


def _plain_wal_database(path: Path) -> None:
    """A SQLite database in WAL mode that is no store (a projection target, another program's file)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()


def _store(path: Path) -> None:
    fencepost.open(f"sqlite:///{path}").close()


def _needs_migrations(path: Path) -> None:
    _store(path)
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM flows_migrations WHERE migration_id = 1006")
    conn.commit()
    conn.close()


def _too_new(path: Path) -> None:
    _store(path)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO flows_migrations (migration_id, name) VALUES (999999, 'future')")
    conn.commit()
    conn.close()


def _renamed(path: Path) -> None:
    _store(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE flows_migrations SET name = 'another' WHERE migration_id = 1001")
    conn.commit()
    conn.close()


def _not_a_database(path: Path) -> None:
    path.write_bytes(b"not a database " * 100)


REFUSED = {
    "not_a_store": (_plain_wal_database, "needs_migrations"),
    "needs_migrations": (_needs_migrations, "needs_migrations"),
    "schema_too_new": (_too_new, "schema_too_new"),
    "schema_mismatch": (_renamed, "schema_mismatch"),
    "not_a_database": (_not_a_database, "not_a_database"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_readonly_sqlite_open_leaves_the_directory_as_it_was(tmp_path: Path, case: str) -> None:
    """SQLite only: the files beside a database are SQLite's (PostgreSQL: the test below)."""
    make, code = REFUSED[case]
    path = tmp_path / "x.db"
    make(path)
    mode = None if case == "not_a_database" else _journal_mode(path)
    before = _listing(tmp_path)
    with pytest.raises(fencepost.OpenError) as err:
        fencepost.open(f"sqlite:///{path}", readonly=True)
    assert err.value.code == code
    assert _listing(tmp_path) == before
    if mode is not None:
        assert _journal_mode(path) == mode


def test_a_successful_readonly_open_leaves_the_file_itself_untouched(tmp_path: Path) -> None:
    """SQLite only. Reading a WAL database needs its ``-shm`` index and ``-wal`` log: SQLite
    creates them beside the file when it can, and a read-only connection cannot remove them at
    close (documented in docs/concepts/backends.md). The database file itself is not changed."""
    path = tmp_path / "x.db"
    with fencepost.open(f"sqlite:///{path}") as store:
        store.runs.create("r1", "{}")
    before = _listing(tmp_path)
    with fencepost.open(f"sqlite:///{path}", readonly=True) as store:
        assert store.runs.get("r1").status == "pending"
    after = _listing(tmp_path)
    assert after["x.db"] == before["x.db"]
    assert set(after) - set(before) <= {"x.db-wal", "x.db-shm"}
    assert _journal_mode(path) == "wal"


@pytest.mark.parametrize("backend", ["postgresql"])  # the SQLite files are checked above
def test_a_refused_readonly_postgres_open_creates_no_schema_or_table(db_url: str, backend: str) -> None:
    """PostgreSQL: a read-only open of a schema that does not exist, or of one holding a store of a
    newer version, creates no schema and changes no table."""
    with pytest.raises(fencepost.OpenError) as err:
        fencepost.open(db_url, readonly=True)
    assert err.value.code == "database_missing"
    schema = db_url.rsplit("schema=", 1)[1].split("&")[0]
    engine = create_engine(db_url.split("?")[0])
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT count(*) FROM information_schema.schemata WHERE schema_name = :s"),
                                 {"s": schema}).scalar()
            assert found == 0
        fencepost.open(db_url).close()
        with engine.begin() as conn:
            conn.execute(text(f'INSERT INTO "{schema}".flows_migrations (migration_id, name) '
                              "VALUES (999999, 'future')"))

        def tables() -> list[tuple[str, int]]:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.execute(text(
                    "SELECT table_name, (xpath('/row/c/text()', query_to_xml(format("
                    "'SELECT count(*) AS c FROM %I.%I', table_schema, table_name), false, true, '')))[1]::text::int "
                    "FROM information_schema.tables WHERE table_schema = :s ORDER BY table_name"), {"s": schema})]

        before = tables()
        with pytest.raises(fencepost.OpenError) as err:
            fencepost.open(db_url, readonly=True)
        assert err.value.code == "schema_too_new"
        assert tables() == before
    finally:
        engine.dispose()


@pytest.mark.parametrize("writer_stays", [False, True])
def test_reads_that_vet_a_readonly_open_run_again_when_a_writer_came_along(tmp_path: Path,
                                                                           writer_stays: bool) -> None:
    """SQLite only: the reads that decide a read-only open see the file as immutable while nobody
    has it open; a writer that came meanwhile (still there: its ``-shm`` is beside the file; or gone:
    its commits are in the file) makes them run again, the ordinary way, and that answer counts."""
    from fencepost._durable import Database

    path = tmp_path / "x.db"
    url = f"sqlite:///{path}"
    _store(path)
    db = Database(url, readonly=True)
    writer = None
    answers: list[int] = []

    def check() -> int:
        nonlocal writer
        answers.append(db.read(lambda conn: conn.exec_driver_sql("SELECT count(*) FROM flows_runs").scalar()))
        if len(answers) == 1:
            writer = fencepost.open(url)
            writer.runs.create("r1", "{}")
            if not writer_stays:
                writer.close()
        return answers[-1]

    try:
        assert db.vetted(check) == 1
        assert answers == [0, 1]
    finally:
        db.dispose()
        if writer is not None:
            writer.close()


def test_a_readonly_store_opened_while_nobody_had_the_file_open_reads_later_commits(tmp_path: Path) -> None:
    """SQLite only: the immutable reads end with the open; the store then reads as any other."""
    path = tmp_path / "x.db"
    url = f"sqlite:///{path}"
    _store(path)
    with fencepost.open(url, readonly=True) as ro, fencepost.open(url) as writer:
        writer.runs.create("r1", "{}")
        assert ro.runs.get("r1").status == "pending"
        writer.runs.create("r2", "{}")
        assert ro.runs.get("r2").status == "pending"


def test_a_readonly_open_through_a_symlink_sees_the_commits_of_a_writer_that_has_the_file_open(
        tmp_path: Path) -> None:
    """SQLite only (the ``-wal``/``-shm`` files are SQLite's). SQLite keeps the ``-wal`` and ``-shm``
    of a file opened through a symbolic link beside the file the link points to, not beside the
    link: whether somebody has the file open is asked there. A store opened read-only through a
    link while a writer holds the file open, its latest commit (the store's last migration) still
    only in the log, opens and reads that commit: it is not refused as ``needs_migrations`` from
    an immutable read of the file alone."""
    real = tmp_path / "real" / "flows.db"
    real.parent.mkdir()
    _store(real)
    conn = sqlite3.connect(real)
    columns = [d[0] for d in conn.execute("SELECT * FROM flows_migrations").description]
    row = conn.execute("SELECT * FROM flows_migrations WHERE migration_id = 1006").fetchone()
    conn.execute("DELETE FROM flows_migrations WHERE migration_id = 1006")
    conn.commit()
    conn.close()
    link = tmp_path / "link.db"
    link.symlink_to(real)
    writer = sqlite3.connect(real, isolation_level=None)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")  # the commit stays in the log
        writer.execute(f"INSERT INTO flows_migrations ({', '.join(columns)}) "
                       f"VALUES ({', '.join('?' * len(columns))})", row)
        assert (tmp_path / "real" / "flows.db-wal").stat().st_size > 0
        with fencepost.open(f"sqlite:///{link}", readonly=True) as store:
            with pytest.raises(fencepost.RunStoreError):
                store.runs.get("r1")  # it reads: no such run
    finally:
        writer.close()
