"""Read commands open the store read-only: one that is refused leaves the SQLite file and the
directory beside it as they were (no ``-wal``/``-shm`` file, the same size and modification time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_readonly_refusal_leaves_nothing import REFUSED, _listing

pytestmark = pytest.mark.cli_in_process


@pytest.mark.parametrize("args", [("runs", "list"), ("feed", "tail"), ("journal", "show", "r1"),
                                  ("migrations", "status")])
@pytest.mark.parametrize("case", ["not_a_store", "schema_too_new", "needs_migrations"])
def test_read_commands_refused_by_a_sqlite_file_leave_it_as_it_was(run_cli, tmp_path: Path, case: str,
                                                                    args: tuple[str, ...]) -> None:
    """SQLite only: the files beside a database are SQLite's."""
    make, _code = REFUSED[case]
    path = tmp_path / "db" / "x.db"
    path.parent.mkdir()
    make(path)
    before = _listing(path.parent)
    result = run_cli("--db", f"sqlite:///{path}", *args)
    if args != ("migrations", "status") or case == "schema_too_new":
        assert result.code != 0, result
    assert _listing(path.parent) == before, result


def test_init_of_a_set_refused_by_one_store_leaves_every_sqlite_file_as_it_was(run_cli, tmp_path: Path) -> None:
    """SQLite only: ``init`` reads every store before it creates or migrates any; refused by one (a
    newer fencepost's store), it leaves the others' files as they were too."""
    make, _code = REFUSED["schema_too_new"]
    good, newer = tmp_path / "db" / "a.db", tmp_path / "db" / "b.db"
    good.parent.mkdir()
    REFUSED["needs_migrations"][0](good)
    make(newer)
    before = _listing(good.parent)
    result = run_cli("--db", f"sqlite:///{good}", "--db", f"sqlite:///{newer}", "init")
    assert result.code != 0, result
    assert _listing(good.parent) == before, result
