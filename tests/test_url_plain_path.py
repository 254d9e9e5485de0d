"""A plain file path where a database URL belongs is refused with the URL form to use instead.

``fencepost.open``, ``--db`` and ``$FENCEPOST_DB`` take URLs (docs/decisions.md says why a plain path
is not taken as SQLite). ``--db /path/file.db`` used to fail with "database URL could not be parsed"
and no hint. Now the error names the ``sqlite:///`` forms, never echoes the value, and nothing is
created (the CLI's side: tests/cli/test_plain_path_db.py). No database is reached, so there is no
backend to vary; the same rule refuses ``host:port/db`` given without ``postgresql://``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fencepost

HINT = "sqlite:///"


def _plain_values(tmp_path: Path) -> list[str]:
    return [str(tmp_path / "data" / "file.db"), "file.db", "./data/file.db", "db.example.org:5432/prod"]


def _nothing_created(tmp_path: Path) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())


@pytest.mark.parametrize("readonly", [False, True])
def test_open_refuses_a_plain_path_naming_the_url_form(tmp_path: Path, monkeypatch, readonly: bool) -> None:
    monkeypatch.chdir(tmp_path)
    for value in _plain_values(tmp_path):
        with pytest.raises(ValueError) as info:
            fencepost.open(value, readonly=readonly)
        text = str(info.value)
        assert "could not be parsed" in text and "no scheme" in text, text
        assert f"{HINT}relative/path.db" in text and "sqlite:////absolute/path.db" in text, text
        assert value not in text and "file.db" not in text, text
    _nothing_created(tmp_path)


def test_fencepost_db_holding_a_plain_path_is_refused_the_same_way(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FENCEPOST_DB", str(tmp_path / "file.db"))
    with pytest.raises(ValueError) as info:
        fencepost.open()
    assert "no scheme" in str(info.value) and HINT in str(info.value)
    _nothing_created(tmp_path)


def test_a_url_that_has_a_scheme_but_does_not_parse_gets_no_path_hint() -> None:
    with pytest.raises(ValueError) as info:
        fencepost.open("postgresql+psycopg://postgres@127.0.0.1:notaport/test")
    assert str(info.value) == "database URL could not be parsed"
