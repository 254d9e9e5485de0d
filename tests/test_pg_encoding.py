"""A PostgreSQL database whose encoding is not UTF8 is refused at open with a clear ``OpenError``.

PostgreSQL-only: a database's encoding is chosen when it is created and only PostgreSQL has one to
choose (a SQLite file stores text as UTF-8). On a SQL_ASCII database psycopg hands text back as
bytes, so opening it used to fail with a raw ``TypeError`` from deep inside the driver's setup; a
LATIN1 one converts only its own repertoire and would refuse a run id outside it at the first write.
Each test creates its own throwaway database (a unique name: tests run in parallel) and drops it.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import make_url

import fencepost
from fencepost import OpenError
from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe
from tests.conftest import require_postgres

SECRET = "secret-pw-Enc-37"


def _server() -> dict[str, object]:
    url = make_url(require_postgres().split("?")[0])
    return {"host": url.host, "port": url.port or 5432, "user": url.username, "connect_timeout": 10}


def _url(database: str) -> str:
    """The test server's URL for ``database``, with a password (trust auth ignores it)."""
    base = make_url(require_postgres().split("?")[0]).set(database=database, password=SECRET)
    return base.render_as_string(hide_password=False)


@pytest.fixture(params=["SQL_ASCII", "LATIN1"])
def foreign_db(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """A fresh, empty database with the encoding ``request.param``: (its name, the encoding)."""
    encoding = request.param
    name = f"fencepost_enc_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **_server()) as conn:
        conn.execute(f"CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' "
                     "TEMPLATE template0")
    try:
        yield name, encoding
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **_server()) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _user_objects(name: str) -> tuple[list[str], list[str]]:
    """The schemas and tables in database ``name`` beyond what every new database has."""
    with psycopg.connect(dbname=name, **_server()) as conn:
        conn.execute("SET client_encoding TO 'UTF8'")  # a SQL_ASCII database hands back bytes otherwise
        schemas = [r[0] for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT IN ('public', 'information_schema') "
            "AND nspname NOT LIKE 'pg\\_%'")]
        tables = [r[0] for r in conn.execute(
            "SELECT schemaname || '.' || tablename FROM pg_tables "
            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")]
    return schemas, tables


@pytest.mark.parametrize("readonly", [False, True])
def test_a_database_that_is_not_utf8_is_refused_and_nothing_is_created(
        foreign_db: tuple[str, str], readonly: bool) -> None:
    name, encoding = foreign_db
    with pytest.raises(OpenError) as err:
        fencepost.open(_url(name), readonly=readonly).close()
    exc = err.value
    assert (exc.code, exc.method, exc.db_code) == ("open_failed", "open", "server_encoding"), str(exc)
    message = str(exc)
    assert f"encoding is {encoding}" in message and "UTF8" in message, message
    assert name in message  # the masked URL names the database
    assert SECRET not in f"{exc} {exc!r}"
    assert exc.__cause__ is None
    assert _user_objects(name) == ([], [])


def test_the_cli_reports_a_database_that_is_not_utf8_on_one_line(foreign_db: tuple[str, str]) -> None:
    name, encoding = foreign_db
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    for args in (["runs", "list"], ["init"], ["migrations", "status"]):
        proc = subprocess.run([fencepost_exe(), "--db", _url(name), *args], capture_output=True, text=True,
                              env={**env, "COLUMNS": "200"}, timeout=60)
        result = Result(proc)
        assert_one_line_error(result)
        assert result.code == 1, result
        assert "open_failed" in result.err and f"encoding is {encoding}" in result.err, result
        assert SECRET not in result.err and SECRET not in result.out
    assert _user_objects(name) == ([], [])
