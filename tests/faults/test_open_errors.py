"""Every way ``fencepost.open`` can fail is a public ``OpenError`` with its own code and message.

The faults are real: a junk file, a corrupted database, a missing file, a read-only filesystem,
a read-only file opened by an unprivileged process, a refused port, an unknown database, an
unknown role, a role without CREATE, an unmigrated database, and a ledger from a newer fencepost.
Messages name the path or the URL with its password masked, and nothing else.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.pool import NullPool

import fencepost
from fencepost import OpenError
from tests.conftest import require_postgres
from tests.faults.conftest import unprivileged

pytestmark = pytest.mark.slow
SECRET = "pw-Secret-77"


def _open_fails(url: str, *, readonly: bool = False) -> OpenError:
    with pytest.raises(OpenError) as err:
        fencepost.open(url, readonly=readonly).close()
    exc = err.value
    assert isinstance(exc, fencepost.FencepostError) and exc.method == "open"
    assert exc.__cause__ is None
    return exc


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    for readonly in (False, True):
        exc = _open_fails(f"sqlite:///{junk}", readonly=readonly)
        assert (exc.code, exc.db_code) == ("not_a_database", "SQLITE_NOTADB")
        assert str(junk) in str(exc) and "is not a SQLite database" in str(exc)
    assert junk.read_bytes() == b"this is not sqlite" * 100  # nothing written to it


def test_a_corrupt_database(tmp_path: Path) -> None:
    path = tmp_path / "flows.db"
    store = fencepost.open(f"sqlite:///{path}")
    for n in range(50):
        store.runs.create(f"r{n}", "{}")
    store.close()
    page = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(path.read_bytes())
    data[page:] = b"\xa5" * (len(data) - page)  # every page but the header page is garbage
    path.write_bytes(bytes(data))
    for readonly in (False, True):
        exc = _open_fails(f"sqlite:///{path}", readonly=readonly)
        assert exc.code == "corrupt" and exc.db_code.startswith("SQLITE_CORRUPT")
        assert str(path) in str(exc) and "corrupt" in exc.detail


def test_a_missing_file_opened_read_only_hints_at_init(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "flows.db"
    exc = _open_fails(f"sqlite:///{path}", readonly=True)
    assert exc.code == "database_missing" and isinstance(exc, fencepost.OpenError)
    assert str(path) in str(exc) and "fencepost init" in str(exc)
    assert not path.parent.exists()


def test_a_read_only_directory(readonly_mount) -> None:
    url = f"sqlite:///{readonly_mount.root / 'flows.db'}"
    with fencepost.open(url) as store:  # a real store, then the filesystem turns read-only
        store.runs.create("r1", "{}")
    readonly_mount.set_readonly(True)
    exc = _open_fails(url)
    assert exc.code == "permission_denied" and exc.db_code == "SQLITE_CANTOPEN"
    assert str(readonly_mount.root / "flows.db") in str(exc)
    # Read-only, it opens and reads (it failed with SQLITE_CANTOPEN: WAL needs a -shm file it
    # cannot create there); writing through it is refused.
    with fencepost.open(url, readonly=True) as store:
        assert store.runs.get("r1") is not None
        assert fencepost.journal.verify(store).ok
        with pytest.raises(fencepost.FencepostError):
            store.runs.create("r2", "{}")
    # A new database cannot be created there either.
    exc = _open_fails(f"sqlite:///{readonly_mount.root / 'sub' / 'new.db'}")
    assert exc.code == "permission_denied"


def test_a_read_only_copy_with_commits_still_in_its_log_is_refused_not_read_without_them(
        readonly_mount, tmp_path) -> None:
    """A copy of the database file and its non-empty -wal log, without the -shm file: read-only
    media cannot be opened the usual way, and reading the file alone would miss the log's commits."""
    source = tmp_path / "flows.db"
    with fencepost.open(f"sqlite:///{source}") as store:
        store.runs.create("r1", "{}")
    conn = sqlite3.connect(source)
    try:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("CREATE TABLE only_in_the_log (x)")
        conn.commit()
        assert source.with_name("flows.db-wal").stat().st_size > 0
        shutil.copy(source, readonly_mount.root / "flows.db")
        shutil.copy(source.with_name("flows.db-wal"), readonly_mount.root / "flows.db-wal")
    finally:
        conn.close()
    readonly_mount.set_readonly(True)
    exc = _open_fails(f"sqlite:///{readonly_mount.root / 'flows.db'}", readonly=True)
    assert exc.code == "permission_denied" and exc.db_code == "SQLITE_CANTOPEN"


def _open_code(url: str, readonly: bool) -> tuple[str, str | None, str] | str:
    try:
        fencepost.open(url, readonly=readonly).close()
    except OpenError as exc:
        return exc.code, exc.db_code, str(exc)
    return "opened"


def test_a_read_only_file() -> None:
    """An unprivileged process: the file is 0444 in a directory it may write."""
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="fencepost-rofile-"))  # /tmp: reachable by any user
    try:
        path = home / "flows.db"
        store = fencepost.open(f"sqlite:///{path}")
        store.runs.create("r1", "{}")
        store.close()
        os.chmod(path, 0o444)
        os.chmod(home, 0o755)
        if os.geteuid() == 0:
            shutil.chown(home, 65534, 65534)
            shutil.chown(path, 65534, 65534)
        url = f"sqlite:///{path}"
        code, db_code, text = unprivileged(_open_code, url, False)
        assert (code, db_code) == ("permission_denied", "SQLITE_READONLY")
        assert str(path) in text and "for writing" in text
        assert unprivileged(_open_code, url, True) == "opened"  # reading it is fine
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_read_only_open_of_an_unmigrated_database(db_url: str, backend: str, tmp_path: Path) -> None:
    """An empty SQLite file, or an empty PostgreSQL schema (one that is not there at all is no
    database: ``database_missing``, as a SQLite file that is not there)."""
    if backend == "sqlite":
        sqlite3.connect(make_url(db_url).database).close()
    else:
        engine = create_engine(require_postgres(), poolclass=NullPool)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f'CREATE SCHEMA "{db_url.rsplit("schema=", 1)[1]}"')
        finally:
            engine.dispose()
    exc = _open_fails(db_url, readonly=True)
    assert exc.code == "needs_migrations" and "fencepost init" in str(exc)


def test_a_schema_newer_than_this_code(db_url: str, backend: str) -> None:
    store = fencepost.open(db_url)
    store.runs.create("kept", "{}")
    store.db.write(lambda c: c.exec_driver_sql(
        "INSERT INTO flows_migrations (migration_id, name) VALUES (1999, 'run-store_from_the_future')"))
    store.close()
    for readonly in (False, True):
        exc = _open_fails(db_url, readonly=readonly)
        assert exc.code == "schema_too_new" and "newer schema" in str(exc)


def _pg(url: str, **parts) -> str:
    return make_url(url).set(**parts).render_as_string(hide_password=False)


def test_postgresql_refused_port() -> None:
    url = _pg(require_postgres(), port=1, password=SECRET)
    exc = _open_fails(url)
    assert exc.code == "cannot_connect"
    assert SECRET not in str(exc) and "127.0.0.1:1" in str(exc) and "***" in str(exc)


def test_postgresql_database_does_not_exist() -> None:
    url = _pg(require_postgres(), database="fencepost_no_such_db", password=SECRET)
    for readonly in (False, True):
        exc = _open_fails(url, readonly=readonly)
        assert exc.code == "database_missing" and "fencepost_no_such_db" in str(exc)
        assert SECRET not in str(exc) and "fencepost init" not in str(exc)


def test_postgresql_role_refused() -> None:
    url = _pg(require_postgres(), username="fencepost_no_such_role", password=SECRET)
    exc = _open_fails(url)
    assert exc.code == "auth_failed" and SECRET not in str(exc)


def test_postgresql_permission_denied(private_server) -> None:
    """A role that may connect but not create the store's schema (on a private server)."""
    admin = create_engine(private_server.url.split("?")[0], poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql("CREATE ROLE limited LOGIN")
    admin.dispose()
    url = _pg(private_server.url, username="limited", password=SECRET)
    exc = _open_fails(url)
    assert (exc.code, exc.db_code) == ("permission_denied", "42501")
    assert SECRET not in str(exc) and "limited" in str(exc)


def test_errors_are_distinct() -> None:
    """One message per code (no two problems share a sentence)."""
    from fencepost._durable import _OPEN_DETAILS

    assert len(set(_OPEN_DETAILS.values())) == len(_OPEN_DETAILS)
