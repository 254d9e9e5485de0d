"""A SQLite path the operating system refuses to look at (a name longer than the file system
allows) is an ``OpenError``, and in the CLI one ``Error:`` line from the store, not a raw OSError.

``Path.is_dir()`` and ``exists()`` re-raise every OSError but a missing file, so a path with a
300-character name ended ``fencepost.open`` with ``OSError: [Errno 36] File name too long`` and
every command, ``init`` included, at the CLI's last-resort boundary. SQLite only: a PostgreSQL URL
names no file.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost.errors import OpenError
from tests.cli.conftest import assert_one_line_error

NAME = "d" * 300  # longer than any common file system's 255-byte name limit


@pytest.mark.parametrize("tail", [f"{NAME}.db", f"{NAME}/flows.db"], ids=["file", "directory"])
@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "read-only"])
def test_open_of_a_path_with_an_overlong_name_raises_open_error(tmp_path, tail, readonly):
    with pytest.raises(OpenError) as info:
        fencepost.open(f"sqlite:///{tmp_path}/{tail}", readonly=readonly)
    assert info.value.code == "open_failed"
    assert "File name too long" in str(info.value)
    assert not any(p.name.startswith("ddd") for p in tmp_path.iterdir())


@pytest.mark.parametrize("command", [["init"], ["runs", "list"], ["journal", "verify"]],
                         ids=["init", "runs-list", "journal-verify"])
@pytest.mark.parametrize("tail", [f"{NAME}.db", f"{NAME}/flows.db"], ids=["file", "directory"])
def test_cli_on_a_path_with_an_overlong_name_says_so_in_one_line(run_cli, tmp_path, command, tail):
    result = run_cli("--db", f"sqlite:///{tmp_path}/{tail}", *command)
    assert_one_line_error(result)
    assert result.code == 1, result
    assert "open_failed" in result.err and "File name too long" in result.err, result
    assert "OSError" not in result.err and "Errno" not in result.err, result
