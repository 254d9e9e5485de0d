"""A NUL character written into a database URL as ``%00`` is refused by name before anything opens.

Found by a new-user walkthrough. The URL parser decodes ``%00`` to a NUL, which no file name and no
libpq connection string can hold:

- SQLite: ``sqlite:///x%00y.db`` failed with Python's bare "embedded null byte" (on the command line
  ``Error: ValueError: embedded null byte``, an unexpected error, exit 1), and read-only (every
  read command) with "no database at x y.db; create it with `fencepost init`", which ``init``
  then could not do.
- PostgreSQL: libpq ends the connection string at the NUL, so ``/te%00st`` or a user ``po%00stgres``
  was reported as ``auth_failed`` (the rest of the string lost), and ``?application_name=a%00b``
  opened the store as if the option had been cut short.

Now a ``ValueError`` naming the URL part (never the value), on both backends, with nothing created.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

import fencepost
from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe
from tests.conftest import drop_schema, require_postgres, store_exists

SECRET = "s3cret-Q-0123456789"


def _cases(backend: str, tmp_path: Path) -> list[tuple[str, str, str]]:
    """(url, the part its message names, the schema to clean up) for each place a NUL can hide."""
    if backend == "sqlite":
        return [(f"sqlite:///{tmp_path}/x%00y.db", "path", ""), (f"sqlite:///{tmp_path}/x%00/flows.db", "path", "")]
    base = require_postgres().split("?")[0].replace("postgres@", f"postgres:{SECRET}@", 1)
    head, _, database = base.rpartition("/")
    cases = []
    for url, part in [(f"{head}/{database}%00x", "database"), (base.replace("postgres:", "post%00gres:", 1), "user"),
                      (base.replace(SECRET, f"{SECRET}%00x", 1), "password"),
                      (f"{base}?application_name=a%00b", "application_name")]:
        schema = f"t_{uuid.uuid4().hex[:16]}"
        cases.append((f"{url}{'&' if '?' in url else '?'}schema={schema}", part, schema))
    return cases


@pytest.mark.parametrize("readonly", [False, True])
def test_a_nul_in_a_url_is_refused_naming_its_part(backend: str, readonly: bool, tmp_path: Path) -> None:
    for url, part, schema in _cases(backend, tmp_path):
        try:
            with pytest.raises(ValueError) as info:
                fencepost.open(url, readonly=readonly)
            message = str(info.value)
            text = f"{message} {info.value.__cause__!r} {info.value.__context__!r}"
            assert "NUL" in message and part in message and "embedded null byte" not in message, message
            assert SECRET not in text and "x.y" not in text, text
            if backend == "postgresql":
                assert not store_exists(f"{require_postgres().split('?')[0]}?schema={schema}")
        finally:
            if schema:
                drop_schema(require_postgres(), schema)
    if backend == "sqlite":
        assert list(tmp_path.iterdir()) == []


def test_the_cli_refuses_a_nul_in_a_sqlite_url_as_a_usage_error(tmp_path: Path) -> None:
    """SQLite only: the command line refuses the PostgreSQL cases through the same ``parse_url``."""
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    for args in (["--db", "sqlite:///x%00y.db", "init"], ["--db", "sqlite:///x%00y.db", "runs", "list"],
                 ["projection", "run", "--target", "sqlite:///x%00y.db"]):
        proc = subprocess.run([fencepost_exe(), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=60)
        result = Result(proc)
        assert_one_line_error(result)
        assert result.code == 2 and "NUL" in result.err and "ValueError" not in result.err, (args, result)
        assert list(tmp_path.iterdir()) == [], (args, list(tmp_path.iterdir()))
