"""``--db`` or ``$FENCEPOST_DB`` holding a plain file path: a usage error naming the ``sqlite:///``
forms, never the value, and nothing created (the library's side: tests/test_url_plain_path.py).
No database is reached, so there is no backend to vary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import Result, assert_one_line_error, fencepost_exe
from tests.test_url_plain_path import _nothing_created, _plain_values


@pytest.mark.parametrize("command", [["init"], ["runs", "list"]])
def test_cli_refuses_a_plain_path_db_with_the_url_form(run_cli, tmp_path: Path, command: list[str]) -> None:
    for value in _plain_values(tmp_path):
        result = run_cli("--db", value, *command)
        assert_one_line_error(result)
        assert result.code == 2, result  # a usage error: nothing was changed
        assert "--db" in result.err and "no scheme" in result.err and "sqlite:////absolute/path.db" in result.err
        assert "file.db" not in result.err, result
    _nothing_created(tmp_path)


def test_cli_refuses_a_plain_path_in_fencepost_db(run_cli, tmp_path: Path) -> None:
    result = run_cli("runs", "list", env={"FENCEPOST_DB": str(tmp_path / "file.db")})
    assert_one_line_error(result)
    assert "no scheme" in result.err and "sqlite:////absolute/path.db" in result.err, result
    assert "file.db" not in result.err, result
    _nothing_created(tmp_path)


def _piped(*args: str, env: dict[str, str] | None = None) -> Result:
    """The CLI with stdout and stderr piped and no ``COLUMNS``: what a user reading through ``| less``
    or a log sees (80 columns)."""
    full = {k: v for k, v in os.environ.items() if k not in ("FENCEPOST_DB", "COLUMNS", "LINES")}
    proc = subprocess.run([fencepost_exe(), *args], capture_output=True, text=True, env={**full, **(env or {})},
                          timeout=60)
    return Result(proc)


def _db_help(text: str) -> str:
    """The ``--db`` entry of the group's help, its wrapped lines joined."""
    entry = text.split("\n  --db ", 1)[1].split("\n  --shards ", 1)[0]
    return " ".join(entry.split())


def test_the_db_help_shows_the_relative_and_the_absolute_sqlite_form_unbroken() -> None:
    """``fencepost --help`` names both SQLite forms, each whole on one line through a pipe (a user
    copies it), as the plain-path error does; before, it showed only ``sqlite:///path.db``, which
    reads as absolute but is relative."""
    result = _piped("--help")
    assert result.code == 0, result
    lines = result.out.splitlines()
    for form in ("sqlite:///relative/path.db", "sqlite:////absolute/path.db"):
        assert any(form in line for line in lines), result.out
    assert all(len(line) <= 80 for line in lines), result.out


def test_the_db_help_says_where_a_password_goes() -> None:
    """A password in ``--db`` is visible to every user of the machine (``ps``): the help says to
    give it through ``$FENCEPOST_DB``, a libpq password file or ``PGPASSWORD`` instead."""
    entry = _db_help(_piped("--help").out)
    assert "ps" in entry and "$FENCEPOST_DB" in entry and "PGPASSWORD" in entry, entry


def test_a_plain_path_db_through_a_pipe_is_one_line_with_both_forms(tmp_path: Path) -> None:
    result = _piped("--db", str(tmp_path / "file.db"), "runs", "list")
    assert_one_line_error(result)
    assert result.code == 2, result
    assert "sqlite:///relative/path.db" in result.err and "sqlite:////absolute/path.db" in result.err, result
    assert "file.db" not in result.err, result
    _nothing_created(tmp_path)
