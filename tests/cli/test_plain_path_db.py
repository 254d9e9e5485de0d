"""``--db`` or ``$FENCEPOST_DB`` holding a plain file path: a usage error naming the ``sqlite:///``
forms, never the value, and nothing created (the library's side: tests/test_url_plain_path.py).
No database is reached, so there is no backend to vary."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import assert_one_line_error
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
