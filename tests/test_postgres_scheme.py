"""``postgres://`` is accepted as ``postgresql+psycopg://``, in the library and the CLI.

Hosting platforms hand out ``DATABASE_URL=postgres://user:password@host/db``; fencepost refused it
("use postgresql://"), so the URL had to be rewritten by hand before use. It is now an alias
everywhere a URL is taken: ``fencepost.open``, ``--db`` and ``$FENCEPOST_DB``. PostgreSQL only: the
alias names no SQLite URL. Errors for such a URL never show its password.
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

import fencepost
from tests.cli.conftest import Result, fencepost_exe
from tests.conftest import _with_schema, drop_schema, require_postgres

SECRET = "pw-0123456789-secret"


@pytest.fixture
def urls():
    """A fresh schema as (``postgres://`` URL, ``postgresql+psycopg://`` URL)."""
    base = require_postgres()
    assert base.startswith("postgresql+psycopg://"), base
    schema = "t_" + uuid.uuid4().hex[:16]
    canonical = _with_schema(base, schema)
    yield "postgres://" + canonical.removeprefix("postgresql+psycopg://"), canonical
    drop_schema(base, schema)


def _cli(*args: str, env: dict[str, str] | None = None) -> Result:
    full = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    full.update(env or {})
    return Result(subprocess.run([fencepost_exe(), *args], capture_output=True, text=True, env=full, timeout=60))


def test_open_accepts_postgres_scheme(urls):
    alias, canonical = urls
    with fencepost.open(alias) as store:
        store.runs.create("made-via-alias", "{}")
    with fencepost.open(canonical, readonly=True) as store:
        assert store.runs.get("made-via-alias").status == "pending"
    with fencepost.open(alias, readonly=True) as store:
        assert store.runs.get("made-via-alias").status == "pending"


def test_the_cli_accepts_postgres_scheme_in_db_and_the_environment(urls):
    alias, canonical = urls
    init = _cli("--db", alias, "init")
    assert init.code == 0, init
    assert _cli("--db", alias, "runs", "create", "r1").code == 0
    created = _cli("runs", "create", "r2", env={"FENCEPOST_DB": alias})
    assert created.code == 0, created
    listed = _cli("--db", canonical, "runs", "list", "--format", "jsonl")
    assert listed.code == 0, listed
    assert sorted(line for line in listed.out.splitlines()) and "r1" in listed.out and "r2" in listed.out


def test_the_same_database_under_both_schemes_is_one_store(urls):
    """Two --db naming one database, one as postgres://, are refused as the same database twice."""
    alias, canonical = urls
    assert _cli("--db", canonical, "init").code == 0
    both = _cli("--db", alias, "--db", canonical, "runs", "list")
    assert both.code == 2, both
    assert "same" in both.err, both


@pytest.mark.parametrize("url", [
    f"postgres://user:{SECRET}@127.0.0.1:1/test?connect_timeout=2",  # nothing listens there
    f"postgres://user:{SECRET}@127.0.0.1:notaport/test",  # malformed
    f"postgres://user:{SECRET}@127.0.0.1/test?schema=Bad-Name",  # a bad option
])
def test_errors_for_a_postgres_url_never_show_its_password(url):
    with pytest.raises(Exception) as info:
        fencepost.open(url).close()
    text = f"{info.value!s} {info.value!r} {info.value.__cause__!r} {info.value.__context__!r}"
    assert SECRET not in text, text
    for args in (["--db", url, "runs", "list"], ["runs", "list"]):
        result = _cli(*args, env={"FENCEPOST_DB": url})
        assert result.code != 0, result
        assert SECRET not in result.err + result.out, result
        assert "unsupported database URL scheme" not in result.err, result
