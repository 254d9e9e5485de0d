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


def test_migrations_status_and_sql_of_a_store_left_at_4001_name_migration_4002(run_cli, db_url):
    """A store the previous version left (migrations up to 4001): ``status`` lists 4002 pending and
    ``sql`` prints exactly it; applied by hand, the store is current."""
    from tests.conftest import back_to_4001

    assert run_cli("--db", db_url, "init").code == 0
    back_to_4001(db_url)
    status = run_cli("--db", db_url, "migrations", "status", "--json")
    assert status.code == 0, status
    assert [r["id"] for r in json.loads(status.out) if r["state"] == "pending"] == [4002]
    assert "shards_founded" in status.out
    sql = run_cli("--db", db_url, "migrations", "sql")
    assert sql.code == 0, sql
    assert sql.out.startswith(f"-- fencepost migrations for {db_url.split(':')[0].split('+')[0]}: 4002\n"), sql.out
    assert "founded_at_ms" in sql.out
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
