"""A PostgreSQL ``--db`` naming a schema that does not exist is ``database_missing``, as a SQLite
file that does not exist is: read commands said ``needs_migrations`` (advice to migrate a store
that is not there) where a projection target in the same case already said ``database_missing``.
``init`` still creates the schema and the store in it."""

from __future__ import annotations

from pathlib import Path

import pytest

import fencepost
from fencepost.errors import DatabaseMissing
from tests.cli.conftest import assert_one_line_error
from tests.conftest import store_exists

READS = [["runs", "list"], ["runs", "show", "r1"], ["journal", "show", "r1"], ["feed", "snapshot", "r1"],
         ["source", "show"]]


@pytest.fixture
def missing_url(backend: str, db_url: str, tmp_path: Path) -> str:
    """A store that is not there, its URL with a password (to be masked): a SQLite file, or a
    PostgreSQL schema nobody created (``db_url`` names it uniquely and drops it afterwards)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'flows.db'}"
    assert not store_exists(db_url)
    return db_url.replace("://postgres@", "://postgres:hunter2@")


def test_a_read_only_open_of_a_missing_schema_is_database_missing(backend, missing_url):
    with pytest.raises(DatabaseMissing) as caught:
        fencepost.open(missing_url, readonly=True)
    assert caught.value.code == "database_missing"
    assert "fencepost init" in str(caught.value)
    if backend == "postgresql":
        assert "no schema t_" in str(caught.value) and "hunter2" not in str(caught.value), caught.value
    assert not store_exists(missing_url)


@pytest.mark.parametrize("command", READS, ids=" ".join)
def test_read_commands_on_a_missing_store_say_database_missing(run_cli, backend, missing_url, command):
    result = run_cli("--db", missing_url, *command)
    assert_one_line_error(result)
    assert result.code == 1
    assert "database_missing" in result.err and "needs_migrations" not in result.err, result.err
    assert "fencepost init" in result.err
    if backend == "postgresql":
        assert "postgres:***@" in result.err and "hunter2" not in result.err, result.err
    assert not store_exists(missing_url)


def test_a_write_command_on_a_missing_store_says_database_missing_and_init_creates_it(run_cli, missing_url):
    cancel = run_cli("--db", missing_url, "runs", "cancel", "r1")
    assert_one_line_error(cancel)
    assert "database_missing" in cancel.err, cancel.err
    assert not store_exists(missing_url)
    assert run_cli("--db", missing_url, "init").code == 0
    assert store_exists(missing_url)
    listed = run_cli("--db", missing_url, "runs", "list")
    assert listed.code == 0, listed


def test_a_read_only_open_of_a_store_that_is_there_costs_no_namespace_lookup(db_url):
    """The schema is looked up only when the store reads as unmigrated (a missing schema reads so):
    a read-only open of a migrated store made one more round trip for it (``pg_namespace``) on every
    open, each read command and each console attempt. On SQLite there is no schema to look up."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    fencepost.open(db_url).close()
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    event.listen(Engine, "before_cursor_execute", seen)
    try:
        fencepost.open(db_url, readonly=True).close()
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
    assert statements, "no statement seen: the listener is not attached"
    assert not [s for s in statements if "pg_namespace" in s], statements
