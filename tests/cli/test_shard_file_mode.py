"""``--shards FILE`` may hold database passwords: a file others may read gets one warning on stderr
naming the file and the fix (``chmod 600``), never the password, as ssh warns of a key others may
read; the command still runs. Mode bits are read with ``os.stat``, so this holds when the tests
run as root too. Only a PostgreSQL URL carries a password, so the stores are PostgreSQL schemas."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import require_postgres

pytestmark = pytest.mark.cli_in_process

SECRET = "s3cret-pw-" + uuid.uuid4().hex[:8]


def _url(password: bool, *, query: bool = False) -> str:
    base = require_postgres()  # postgresql+psycopg://postgres@127.0.0.1:5432/test (trust auth)
    schema = "t_" + uuid.uuid4().hex[:16]
    sep = "&" if "?" in base else "?"
    if password and query:
        return f"{base}{sep}password={SECRET}&schema={schema}"
    if password:
        base = base.replace("://postgres@", f"://postgres:{SECRET}@", 1)
        assert SECRET in base
    return f"{base}{sep}schema={schema}"


def _shard_file(tmp_path: Path, mode: int, lines: list[str]) -> Path:
    path = tmp_path / "stores.txt"
    path.write_text("".join(line + "\n" for line in lines))
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o444])
@pytest.mark.parametrize("query", [False, True])
def test_a_shard_file_others_may_read_with_a_password_warns_once(run_cli, tmp_path, mode, query):
    path = _shard_file(tmp_path, mode, [f"a={_url(False)}", f"b={_url(True, query=query)}"])
    result = run_cli("--shards", str(path), "runs", "list")
    assert result.err.lower().count("warning") == 1, result
    warning = next(line for line in result.err.splitlines() if "warning" in line.lower())
    assert str(path) in warning and f"chmod 600 {path}" in warning, result
    assert SECRET not in result.err and SECRET not in result.out


@pytest.mark.parametrize(("mode", "password"), [(0o600, True), (0o400, True), (0o644, False)])
def test_no_warning_for_a_private_file_or_one_without_passwords(run_cli, tmp_path, mode, password):
    path = _shard_file(tmp_path, mode, [f"a={_url(False)}", f"b={_url(password)}"])
    result = run_cli("--shards", str(path), "runs", "list")
    assert "warning" not in result.err.lower() and "chmod" not in result.err, result
    assert SECRET not in result.err
