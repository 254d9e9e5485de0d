"""Defect (found by a review, PostgreSQL only: ``?schema=`` is a PostgreSQL URL option): a store's
``?schema=`` took PostgreSQL's own schemas. ``schema=information_schema`` opened and migrated,
creating fencepost's tables and functions among the catalog views; ``pg_catalog`` and ``pg_temp``
failed with an ``open_failed`` that gave no reason. Now ``information_schema`` and every ``pg_``
name (the server reserves them) are refused before anything connects, with a ``ValueError``
naming the ``schema`` option and saying it is a system schema; ``public`` and names of your own
stay allowed. A write open is tried only once the refusal is shown not to connect (``Database``),
and the catalog is compared before and after: nothing is created anywhere."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

import fencepost
from fencepost._dialects import PostgresBackend, schema_problem
from fencepost._durable import Database
from tests.conftest import require_postgres

SYSTEM = ["information_schema", "pg_catalog", "pg_temp", "pg_toast", "pg_temp_3", "pg_mine", "pg_"]

# fencepost's tables and functions (flows_*) in PostgreSQL's own schemas and in public.
_FOUND = text("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
              "WHERE c.relname LIKE 'flows%' AND (n.nspname LIKE 'pg\\_%' OR n.nspname IN "
              "('information_schema', 'public')) "
              "UNION ALL SELECT n.nspname, p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
              "WHERE p.proname LIKE 'flows%' AND (n.nspname LIKE 'pg\\_%' OR n.nspname IN "
              "('information_schema', 'public')) ORDER BY 1, 2")


def _url(schema: str) -> str:
    base = require_postgres()
    return f"{base}{'&' if '?' in base else '?'}schema={schema}"


def _system_objects() -> list[tuple[str, str]]:
    engine = create_engine(require_postgres(), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(_FOUND)]
    finally:
        engine.dispose()


def _assert_system_schema_refusal(err: pytest.ExceptionInfo[ValueError], schema: str) -> None:
    message = str(err.value)
    assert "schema" in message and "system schema" in message, message
    if schema not in ("information_schema", "pg_"):  # named by the rule itself
        assert schema not in message, message  # the value is not echoed


@pytest.mark.parametrize("schema", SYSTEM)
def test_a_system_schema_is_refused_before_anything_connects(schema) -> None:
    with pytest.raises(ValueError) as err:
        PostgresBackend(schema)
    _assert_system_schema_refusal(err, schema)
    with pytest.raises(ValueError) as err:
        Database(_url(schema))  # builds the engine before any connection: refused first
    _assert_system_schema_refusal(err, schema)


@pytest.mark.parametrize("schema", SYSTEM)
def test_open_and_open_shards_refuse_a_system_schema_and_create_nothing(schema) -> None:
    with pytest.raises(ValueError):
        Database(_url(schema))  # the guard: never a write open of a system schema that may connect
    before = _system_objects()
    for readonly in (True, False):
        with pytest.raises(ValueError) as err:
            fencepost.open(_url(schema), readonly=readonly)
        _assert_system_schema_refusal(err, schema)
    with pytest.raises((ValueError, fencepost.FencepostError)) as err:
        fencepost.open_shards([_url(schema)])
    assert "system schema" in str(err.value), err.value
    assert _system_objects() == before


@pytest.mark.parametrize("schema", ["public", "flows", "pgx", "pg", "my_pg_schema", "information_schemas", "_pg_"])
def test_schemas_of_your_own_are_not_system_schemas(schema) -> None:
    assert schema_problem(schema) is None
    PostgresBackend(schema)


def test_the_name_rule_still_comes_first() -> None:
    assert schema_problem("Pg_Catalog") == "schema must match [a-z_][a-z0-9_]{0,62}"


@pytest.mark.parametrize("schema", ["information_schema", "pg_catalog"])
def test_the_cli_refuses_a_system_schema_as_a_usage_error(schema, monkeypatch) -> None:
    from click.testing import CliRunner

    from fencepost.cli import cli

    before = _system_objects()
    monkeypatch.delenv("FENCEPOST_DB", raising=False)
    given = CliRunner().invoke(cli, ["--db", _url(schema), "init"])
    assert given.exit_code == 2 and "--db: schema names a PostgreSQL system schema" in given.output, given.output
    monkeypatch.setenv("FENCEPOST_DB", _url(schema))
    env = CliRunner().invoke(cli, ["runs", "list"])
    assert env.exit_code == 2 and "$FENCEPOST_DB: schema names a PostgreSQL system schema" in env.output, env.output
    assert _system_objects() == before
