"""``init`` says what it did; ``migrations status|sql``; a database newer than the code is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sqlalchemy import text

import fencepost
from fencepost._durable import Database
from fencepost._migrations import ALL_NAMESPACES, STORE_NAMESPACES, discover
from tests.cli.conftest import assert_one_line_error

# Each command runs through fencepost.cli.main in this interpreter (see run_cli in conftest.py).
pytestmark = pytest.mark.cli_in_process


def _store_ids(db_url: str) -> list[int]:
    suffix = "sqlite" if db_url.startswith("sqlite") else "postgresql"
    return [m.id for m in discover(suffix, STORE_NAMESPACES)]


def test_init_says_created_then_current_then_migrated(run_cli, db_url):
    first = run_cli("--db", db_url, "init")
    assert first.code == 0, first
    assert first.out.startswith("created ") and f"{len(_store_ids(db_url))} migrations" in first.out
    second = run_cli("--db", db_url, "init")
    assert second.code == 0 and second.out.startswith("current: ")
    # Forget migration 1006's ledger row and undo its effect: init applies exactly that one.
    db = Database(db_url)
    db.write(lambda conn: conn.execute(text("DELETE FROM flows_migrations WHERE migration_id = 1006")))
    db.write(lambda conn: conn.exec_driver_sql("ALTER TABLE flows_runs DROP COLUMN failure_json"))
    db.dispose()
    third = run_cli("--db", db_url, "init")
    assert third.code == 0, third
    assert third.out.startswith("migrated ") and third.out.rstrip().endswith("1 migration(s): 1006")


def test_migrations_status_lists_applied_and_pending(run_cli, db_url):
    fresh = run_cli("--db", db_url, "migrations", "status")
    assert fresh.code == 0, fresh
    ids = _store_ids(db_url)
    assert all(str(i) in fresh.out for i in ids) and f"0 applied, {len(ids)} pending" in fresh.out
    assert run_cli("--db", db_url, "init").code == 0
    done = run_cli("--db", db_url, "migrations", "status", "--json")
    assert done.code == 0, done
    rows = json.loads(done.out)
    assert [r["id"] for r in rows] == ids and {r["state"] for r in rows} == {"applied"}


def test_migrations_sql_prints_a_script_a_dba_can_apply(run_cli, db_url, tmp_path):
    result = run_cli("--db", db_url, "migrations", "sql")
    assert result.code == 0, result
    script = result.out
    assert "CREATE TABLE flows_runs" in script and "INSERT INTO flows_migrations" in script
    assert "failure_json" in script
    # Nothing was created by printing it; applying it makes a store that opens read-only as current.
    if db_url.startswith("sqlite"):
        path = db_url.removeprefix("sqlite:///")
        assert not os.path.exists(path)
        import sqlite3

        conn = sqlite3.connect(path)
        conn.executescript(script)
        conn.close()
    else:
        db = Database(db_url)
        db.write(lambda conn: conn.exec_driver_sql(script))
        db.dispose()
    with fencepost.open(db_url, readonly=True) as store:
        store.runs.create  # noqa: B018 - opening read-only proves nothing is pending
    status = run_cli("--db", db_url, "migrations", "status", "--json")
    assert status.code == 0 and {r["state"] for r in json.loads(status.out)} == {"applied"}
    assert run_cli("--db", db_url, "migrations", "sql").out.strip().startswith("-- nothing to apply")


def test_a_database_newer_than_the_code_is_refused_with_a_clear_error(run_cli, db_url):
    fencepost.open(db_url).close()
    db = Database(db_url)
    db.write(lambda conn: conn.execute(
        text("INSERT INTO flows_migrations (migration_id, name) VALUES (1999, 'run-store_from_the_future')")))
    db.dispose()
    with pytest.raises(fencepost.FencepostError) as err:
        fencepost.open(db_url)
    assert "newer" in str(err.value) and "1999" in str(err.value)
    with pytest.raises(fencepost.FencepostError):
        fencepost.open(db_url, readonly=True)
    result = run_cli("--db", db_url, "runs", "list")
    assert_one_line_error(result)
    assert "newer" in result.err and "upgrade" in result.err
    status = run_cli("--db", db_url, "migrations", "status")
    assert "1999" in status.out and "unknown" in status.out


def test_known_namespaces_cover_every_shipped_migration():
    for suffix in ("sqlite", "postgresql"):
        assert {m.id for m in discover(suffix, ALL_NAMESPACES)} >= {1006}


def test_a_postgresql_url_without_psycopg_says_which_extra_to_install(tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nsys.modules['psycopg'] = None  # as if psycopg were not installed\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    env.pop("FENCEPOST_DB", None)
    code = ("import fencepost\n"
            "try:\n"
            "    fencepost.open('postgresql+psycopg://u@127.0.0.1:1/none')\n"
            "except fencepost.FencepostError as e:\n"
            "    print(e)\n")
    lib = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "fencepost[postgres]" in lib.stdout, lib
    from tests.cli.conftest import fencepost_exe

    cli = subprocess.run([fencepost_exe(), "--db", "postgresql://u@127.0.0.1:1/none", "runs", "list"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert cli.returncode == 1 and "fencepost[postgres]" in cli.stderr and "Traceback" not in cli.stderr
    # SQLite users need nothing of PostgreSQL.
    ok = subprocess.run([fencepost_exe(), "--db", f"sqlite:///{tmp_path / 'x.db'}", "init"],
                        capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0, ok.stderr


def test_psycopg_is_the_postgres_extra_and_the_test_extra_still_pulls_it():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("psycopg")]
    extras = project["optional-dependencies"]
    assert any(d.startswith("psycopg[binary]") for d in extras["postgres"])
    assert any(d.startswith("psycopg[binary]") for d in extras["test"])


@pytest.mark.parametrize("command", [["migrations", "status"], ["migrations", "sql"]], ids=" ".join)
def test_migrations_commands_say_why_a_database_cannot_be_read(run_cli, tmp_path, command):
    """``migrations status|sql`` read the ledger without the open's diagnosis: a file that is no
    SQLite database, a PostgreSQL server that refuses connections or a database that does not
    exist all printed "database failure: persistence_failed (no code)". They now say what
    ``init`` says, and still change nothing."""
    from tests.conftest import require_postgres

    junk = tmp_path / "junk.db"
    junk.write_text("hello")
    base = require_postgres().rsplit("/", 1)[0]
    cases = [(f"sqlite:///{junk}", "not_a_database"),
             ("postgresql+psycopg://nobody:pw@127.0.0.1:1/x", "cannot_connect"),
             (f"{base}/fencepost_no_such_db", "database_missing")]
    for url, code in cases:
        result = run_cli("--db", url, *command)
        assert result.code == 1, (url, result)
        assert_one_line_error(result)
        assert f"Error: {code}:" in result.err and "persistence_failed" not in result.err, (url, result)
        assert "pw@" not in result.err
    assert junk.read_text() == "hello"


# --------------------------------------------------------------------------- read-only, current


def _cli_in_process(args: list[str]) -> tuple[int, str, str]:
    """The CLI's ``main`` in this process (for a forked, unprivileged child): exit code, out, err."""
    import contextlib
    import io

    from fencepost.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _unapply(db_url: str, *ids: int) -> None:
    """Undo migrations 1006 and/or 4001 and forget their ledger rows: a store an older fencepost made.
    Undoing 4001 forgets 4002 to 4004 too (they change its table: a version without 4001 had none
    of them, and an open refuses a ledger that records them without the column 4002 adds)."""
    undo = {1006: "ALTER TABLE flows_runs DROP COLUMN failure_json", 4001: "DROP TABLE flows_shard_membership"}
    db = Database(db_url)
    for i in ids:
        db.write(lambda conn, i=i: conn.exec_driver_sql(undo[i]))
        for j in (i, 4002, 4003, 4004) if i == 4001 else (i,):
            db.write(lambda conn, j=j: conn.execute(text("DELETE FROM flows_migrations WHERE migration_id = :i"),
                                                    {"i": j}))
    db.dispose()


def _ledger_rows(db_url: str) -> list[tuple[int, str]]:
    db = Database(db_url)  # writable: closing it leaves no -wal or -shm file behind
    try:
        return db.read(lambda conn: [(int(a), b) for a, b in conn.exec_driver_sql(
            "SELECT migration_id, name FROM flows_migrations ORDER BY migration_id")])
    finally:
        db.dispose()


class ReaderInit:
    """A store (``url``) and ``init(place) -> (code, out, err)``: ``fencepost init`` run by someone
    who may read the store but not write it. SQLite: ``place`` is ``"file"`` (the file is 0444) or
    ``"directory"`` (its directory is 0555), in a forked process without root's override (the file
    lives under /tmp, reachable by any user). PostgreSQL: a role with USAGE on the schema and SELECT
    on its tables only (``place`` makes no difference)."""

    def __init__(self, backend: str, db_url: str) -> None:
        import tempfile

        self.backend = backend
        self.home = tempfile.mkdtemp(prefix="fencepost-reader-") if backend == "sqlite" else None
        self.url = f"sqlite:///{self.home}/flows.db" if self.home else db_url
        self.cleanup: list = []

    def init(self, place: str) -> tuple[int, str, str]:
        import shutil
        import tempfile
        import uuid

        from sqlalchemy import create_engine, make_url
        from sqlalchemy.pool import NullPool

        from tests.conftest import require_postgres
        from tests.faults.conftest import unprivileged

        if self.home is not None:
            path = f"{self.home}/flows.db"
            os.chmod(self.home, 0o755)
            if os.geteuid() == 0:
                shutil.chown(self.home, 65534, 65534)
                shutil.chown(path, 65534, 65534)
            os.chmod(path, 0o444) if place == "file" else os.chmod(self.home, 0o555)
            # Walk the same paths here first: the unprivileged child may not be able to read the
            # interpreter's own library to import what it needs.
            warm = tempfile.mkdtemp(prefix="fencepost-warm-")
            for args in (["init"], ["migrations", "status"], ["runs", "list"]):
                _cli_in_process(["--db", f"sqlite:///{warm}/flows.db", *args])
            shutil.rmtree(warm)
            assert sorted(os.listdir(self.home)) == ["flows.db"]
            return unprivileged(_cli_in_process, ["--db", self.url, "init"])
        role = "fp_reader_" + uuid.uuid4().hex[:8]
        schema = self.url.rsplit("schema=", 1)[1]
        admin = create_engine(require_postgres(), poolclass=NullPool, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
            conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
            conn.exec_driver_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")

        def drop() -> None:
            with admin.connect() as conn:
                conn.exec_driver_sql(f"DROP OWNED BY {role}")
                conn.exec_driver_sql(f"DROP ROLE {role}")
            admin.dispose()

        self.cleanup.append(drop)
        url = make_url(self.url).set(username=role).render_as_string(hide_password=False)
        return _cli_in_process(["--db", url, "init"])

    def close(self) -> None:
        import shutil

        for fn in reversed(self.cleanup):
            fn()
        if self.home is not None:
            os.chmod(self.home, 0o755)
            shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def reader(backend, db_url):
    made = ReaderInit(backend, db_url)
    yield made
    made.close()


@pytest.mark.parametrize("place", ["file", "directory"])
def test_init_of_a_current_store_it_may_only_read_says_current(reader, place):
    """``init`` on a fully migrated store this user may read but not write (a 0444 SQLite file, a
    SQLite file in a 0555 directory, a PostgreSQL role with SELECT only) was refused with
    ``permission_denied``, though there was nothing to write. It now says ``current``, exit 0."""
    fencepost.open(reader.url).close()
    before = _ledger_rows(reader.url)
    code, out, err = reader.init(place)
    assert (code, err) == (0, ""), (code, out, err)
    assert out.startswith("current: ") and "no migration to apply" in out and "read-only" in out, out
    assert _ledger_rows(reader.url) == before


def test_init_of_a_store_it_may_only_read_with_migrations_pending_is_still_refused(reader):
    """The other side: with a migration to apply, a store this user may not write is refused
    (``permission_denied``, exit 1) and says what is pending; nothing changes."""
    fencepost.open(reader.url).close()
    _unapply(reader.url, 4001)
    before = _ledger_rows(reader.url)
    code, out, err = reader.init("file")
    assert code == 1 and out == "" and err.startswith("Error: permission_denied:"), (code, out, err)
    assert "4 migration(s) pending (4001, 4002, 4003, 4004)" in err, err
    assert _ledger_rows(reader.url) == before


# --------------------------------------------------------------------------- the ledger's names


def _rename_in_ledger(db_url: str, migration_id: int, name: str) -> None:
    db = Database(db_url)
    db.write(lambda conn: conn.execute(text("UPDATE flows_migrations SET name = :n WHERE migration_id = :i"),
                                       {"n": name, "i": migration_id}))
    db.dispose()


def test_a_migration_recorded_under_another_name_is_flagged_alike_by_status_sql_init_and_reads(run_cli, db_url):
    """A ledger row whose name is not the code's name for its id: ``migrations status`` listed it
    as applied (exit 0) and ``migrations sql`` printed "nothing to apply", while ``init`` refused
    the database with ``persistence_failed``. Now status marks the row ``mismatch`` and exits 1,
    and sql, init and the read commands all refuse it with ``schema_mismatch`` naming the id."""
    fencepost.open(db_url).close()
    _rename_in_ledger(db_url, 1003, "run-store_something_else")
    before = _ledger_rows(db_url)
    status = run_cli("--db", db_url, "migrations", "status")
    assert status.code == 1, status
    row = next(line for line in status.out.splitlines() if line.startswith("1003"))
    assert "mismatch" in row and "applied" not in row, status.out
    assert "1 recorded under another name" in status.out, status.out
    as_json = run_cli("--db", db_url, "migrations", "status", "--json")
    assert as_json.code == 1
    states = {r["id"]: r["state"] for r in json.loads(as_json.out)}
    assert states[1003] == "mismatch" and states[1001] == "applied"
    for args in (("migrations", "sql"), ("init",), ("runs", "list")):
        result = run_cli("--db", db_url, *args)
        assert_one_line_error(result)
        assert result.code == 1 and "Error: schema_mismatch:" in result.err and "1003" in result.err, (args, result)
        assert "nothing to apply" not in result.out
    assert _ledger_rows(db_url) == before


# --------------------------------------------------------------------------- partly migrated


def test_read_commands_on_a_partly_migrated_store_say_what_is_pending_and_how_to_apply_it(run_cli, db_url):
    """A store with some migrations applied and others pending: the read commands said "is not a
    migrated fencepost store", as for a database fencepost never touched. They now say how many
    migrations are pending, which, and that ``fencepost init`` applies them; one line, exit 1."""
    fencepost.open(db_url).close()
    _unapply(db_url, 1006, 4001)
    before = _ledger_rows(db_url)
    for args in (("runs", "list"), ("feed", "tail"), ("journal", "show", "r1"), ("runs", "show", "r1")):
        result = run_cli("--db", db_url, *args)
        assert_one_line_error(result)
        assert result.code == 1 and "Error: needs_migrations:" in result.err, (args, result)
        assert "not a migrated fencepost store" not in result.err, result
        assert "5 migration(s) pending (1006, 4001, 4002, 4003, 4004)" in result.err, result
        assert "fencepost init" in result.err, result
    assert _ledger_rows(db_url) == before
    assert run_cli("--db", db_url, "init").out.startswith("migrated ")


def test_read_commands_on_a_database_fencepost_never_migrated_keep_their_message(run_cli, db_url):
    """The untouched case keeps saying it is no fencepost store yet."""
    if db_url.startswith("sqlite"):
        import sqlite3

        sqlite3.connect(db_url.removeprefix("sqlite:///")).close()
    else:
        db = Database(db_url)
        db.write(lambda conn: conn.exec_driver_sql(f"CREATE SCHEMA {db.schema}"))
        db.dispose()
    result = run_cli("--db", db_url, "runs", "list")
    assert_one_line_error(result)
    assert "is not a migrated fencepost store" in result.err and "fencepost init" in result.err, result


def test_init_says_when_it_created_the_sqlite_files_directory(run_cli, tmp_path):
    """``init`` on a SQLite path whose directory does not exist creates it (the default
    ``.flows/flows.db`` relies on that), but did so silently, so a mistyped path made a new
    directory tree unnoticed. It now says which directory it created, and ``init --help`` says it
    will; a directory that exists is not mentioned."""
    target = tmp_path / "new" / "deeper" / "flows.db"
    result = run_cli("--db", f"sqlite:///{target}", "init")
    assert result.code == 0, result
    assert result.out.startswith("created ") and f"created the directory {target.parent}" in result.out, result
    again = run_cli("--db", f"sqlite:///{tmp_path / 'new' / 'other.db'}", "init")
    assert again.code == 0 and "directory" not in again.out, again
    help_text = " ".join(run_cli("init", "--help").out.split())
    assert "creates the SQLite file's directory" in help_text, help_text


def test_the_sql_a_dba_is_given_cites_no_internal_document(run_cli, db_url):
    """``migrations sql`` prints each migration's comments to the DBA, and they cited the
    project's internal notes ("REFERENCE 1.7", "SPEC 6", "seed execution-revisions.md"), which
    a user has no copy of. The comments now say what the migration does and nothing more."""
    import re

    cites = re.compile(r"\b(SPEC|REFERENCE) \d|\bseed |PITFALLS")
    script = run_cli("--db", db_url, "migrations", "sql").out
    assert "CREATE TABLE flows_runs" in script
    assert not cites.findall(script), cites.findall(script)
    for suffix in ("sqlite", "postgresql"):  # the projections' migrations too (projection run applies them)
        for m in discover(suffix, ALL_NAMESPACES):
            assert not cites.search(m.script), (suffix, m.id)


@pytest.mark.parametrize("command", [["init"], ["migrations", "status"], ["migrations", "sql"], ["runs", "list"]],
                         ids=" ".join)
def test_a_sqlite_path_that_is_a_directory_or_under_a_file_is_named_as_such(run_cli, tmp_path, command):
    """A SQLite URL naming a directory was "permission denied ... [SQLITE_CANTOPEN]" for init and
    "could not be opened [SQLITE_IOERR_READ]" for the read commands; one whose directory path runs
    through a file was "permission denied". Neither is about permissions (SQLite only: a
    PostgreSQL URL has no path). Each now says what is wrong, and nothing is created."""
    folder = tmp_path / "folder"
    folder.mkdir()
    plain = tmp_path / "plain.txt"
    plain.write_text("hello")
    # A URL ending in "/" is refused as a usage error (exit 2) before any file is looked at.
    for url, says, code in ((f"sqlite:///{folder}", "is a directory", 1),
                            (f"sqlite:///{folder}/", "not a directory", 2),
                            (f"sqlite:///{plain}/flows.db", "is not a directory", 1)):
        result = run_cli("--db", url, *command)
        assert_one_line_error(result)
        assert result.code == code and says in result.err and "permission" not in result.err, (url, result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "plain.txt"]
    assert list(folder.iterdir()) == [] and plain.read_text() == "hello"


def test_migrations_status_and_sql_of_a_store_left_at_4001_name_migrations_4002_to_4004(run_cli, db_url,
                                                                                    make_db_url):
    """A store an earlier version left (migrations up to 4001): ``status`` lists 4002, 4003 and 4004
    pending and ``sql`` prints exactly them; applied by hand, the store is current, with the schema
    ``init`` makes."""
    from tests.conftest import back_to_4001

    assert run_cli("--db", db_url, "init").code == 0
    back_to_4001(db_url)
    status = run_cli("--db", db_url, "migrations", "status", "--json")
    assert status.code == 0, status
    assert [r["id"] for r in json.loads(status.out) if r["state"] == "pending"] == [4002, 4003, 4004]
    assert all(name in status.out for name in ("shards_founded", "shards_mark_earlier_records",
                                                "shards_safe_integers"))
    sql = run_cli("--db", db_url, "migrations", "sql")
    assert sql.code == 0, sql
    backend = db_url.split(':')[0].split('+')[0]
    assert sql.out.startswith(f"-- fencepost migrations for {backend}: 4002, 4003, 4004\n"), sql.out
    assert "founded_at_ms" in sql.out and "\n-- 4004 shards_safe_integers\n" in sql.out
    db = Database(db_url)
    if db_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        conn.executescript(sql.out)
        conn.close()
    else:
        db.write(lambda conn: conn.exec_driver_sql(sql.out))
    db.dispose()
    status = run_cli("--db", db_url, "migrations", "status", "--json")
    assert {r["state"] for r in json.loads(status.out)} == {"applied"}
    by_init = make_db_url()
    assert run_cli("--db", by_init, "init").code == 0
    assert _schema_of(db_url) == _schema_of(by_init)


# --------------------------------------------------------------------------- the printed script in a session


def _schema_of(url: str) -> list[tuple]:
    """Everything the migrations made, comparable across two stores: SQLite's ``sqlite_master``;
    PostgreSQL's columns, constraints, indexes, triggers and functions (with their pinned settings),
    the schema's own name written as ``<schema>``."""
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            return sorted(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
        finally:
            conn.close()
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from tests.conftest import require_postgres

    schema = url.rsplit("schema=", 1)[1]
    queries = (
        "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns "
        "WHERE table_schema = :s",
        "SELECT c.relname, k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k "
        "JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s",
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = :s",
        "SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s AND NOT t.tgisinternal",
        "SELECT p.proname, p.prosrc, coalesce(array_to_string(p.proconfig, ','), '') FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = :s",
    )
    engine = create_engine(require_postgres(), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = [tuple(str(v).replace(schema, "<schema>") for v in row)
                    for q in queries for row in conn.execute(text(q), {"s": schema})]
    finally:
        engine.dispose()
    return sorted(rows)


def test_the_printed_script_run_in_a_session_leaves_its_settings_and_matches_init(run_cli, make_db_url):
    """Pasting the ``migrations sql`` script into a session (psql, or any client in autocommit mode)
    left that session's ``search_path`` pointing at the store's schema on PostgreSQL: the script set
    it with a session-wide ``SET``, and the DBA's next statements resolved their names there. The
    script now runs in its own transaction and sets the path with ``SET LOCAL``: afterwards the
    session's ``search_path`` is what it was, and the schema made is the one ``fencepost init``
    makes. (SQLite has no ``search_path``: there the script is checked to make init's schema.)"""
    by_script, by_init = make_db_url(), make_db_url()
    assert run_cli("--db", by_init, "init").code == 0
    result = run_cli("--db", by_script, "migrations", "sql")
    assert result.code == 0, result
    if by_script.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(by_script.removeprefix("sqlite:///"))
        conn.executescript(result.out)
        conn.close()
    else:
        import psycopg
        from sqlalchemy import make_url

        from tests.conftest import require_postgres

        base = make_url(require_postgres()).set(drivername="postgresql")
        with psycopg.connect(base.render_as_string(hide_password=False), autocommit=True) as session:
            before = session.execute("SHOW search_path").fetchone()[0]
            session.execute(result.out.encode())  # one simple-protocol string, as psql sends a pasted script
            assert session.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # committed, not left open
            assert session.execute("SHOW search_path").fetchone()[0] == before
    assert _schema_of(by_script) == _schema_of(by_init)
    fencepost.open(by_script, readonly=True).close()  # a read-only open refuses a store with anything pending
    assert run_cli("--db", by_script, "migrations", "sql").out.startswith("-- nothing to apply")
