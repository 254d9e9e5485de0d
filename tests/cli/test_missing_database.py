"""A PostgreSQL URL naming a database that does not exist says what to do about it, as a missing
SQLite file or PostgreSQL schema does (both name ``fencepost init``, which creates them).

Defect: it said only ``no database at URL``, from ``init`` too, leaving an operator new to
PostgreSQL to guess; ``fencepost init`` cannot help, since it creates a schema and its tables, never
a database. Now the message says to create the database first (UTF8, as the store requires), and
that fencepost creates none; it still never advises ``fencepost init``. PostgreSQL only: a SQLite
file is its own database, and a missing one already says ``fencepost init``, which creates it
(``tests/cli/test_missing_schema.py``).
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import make_url

from tests.cli.conftest import assert_one_line_error


@pytest.fixture
def no_database_url(pg_url: str) -> str:
    """``pg_url`` with a database name nobody created, and a password (to be masked)."""
    url = make_url(pg_url).set(database="nodb_" + uuid.uuid4().hex[:12], password="hunter2")
    return url.render_as_string(hide_password=False)


@pytest.mark.parametrize("command", [["runs", "list"], ["init"], ["runs", "create", "r1"]], ids=" ".join)
def test_a_missing_database_says_to_create_it_first(run_cli, no_database_url, command):
    result = run_cli("--db", no_database_url, *command)
    assert_one_line_error(result)
    assert result.code == 1, result
    assert "database_missing" in result.err, result
    assert "CREATE DATABASE" in result.err and "ENCODING 'UTF8'" in result.err, result
    assert "fencepost creates none" in result.err and "fencepost init" not in result.err, result
    assert "hunter2" not in result.err and "***" in result.err, result
