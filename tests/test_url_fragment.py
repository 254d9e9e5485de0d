"""A '#' after the '?' of a SQLite URL: the URL parser keeps it as text, not as a fragment.

``sqlite:///dir/runs?#2026.db`` (an unencoded ``?#`` in a file name) opened, and created, the file
``dir/runs``: the raw query the URL was checked against was cut at the '#', so the text that is not
``name=value`` went unseen. ``?#a=1`` was refused as "unknown URL option an option". Both are
refused now, saying how to write the characters; a '#' in the path before any '?' is part of the
file name, as it always was.
"""

from __future__ import annotations

import os
import subprocess

import pytest

import fencepost


def _refused(url: str) -> str:
    with pytest.raises(ValueError) as info:
        fencepost.open(url)
    return str(info.value)


@pytest.mark.parametrize("tail", ["runs?#2026.db", "runs?#a=1", "runs?synchronous=FULL&#x=1", "runs?#"])
def test_a_hash_after_the_question_mark_is_refused_and_nothing_is_created(tmp_path, tail: str) -> None:
    message = _refused(f"sqlite:///{tmp_path / 'x'}/{tail}")
    assert "'#'" in message and "%23" in message and "%3F" in message
    assert "an option" not in message
    assert not (tmp_path / "x").exists()


def test_the_names_written_percent_encoded_are_the_file_name(tmp_path) -> None:
    store = fencepost.open(f"sqlite:///{tmp_path}/runs%3F%232026.db")
    store.close()
    assert (tmp_path / "runs?#2026.db").exists() and not (tmp_path / "runs").exists()


def test_a_hash_in_the_path_without_a_question_mark_stays_part_of_the_file_name(tmp_path) -> None:
    store = fencepost.open(f"sqlite:///{tmp_path}/runs#2026.db")
    store.close()
    assert (tmp_path / "runs#2026.db").exists() and not (tmp_path / "runs").exists()


def test_an_empty_own_option_after_a_hash_in_a_postgresql_value_is_still_refused() -> None:
    """The raw query was cut at '#' for PostgreSQL URLs too, so ``?schema=`` after a value holding
    a '#' went unchecked and silently meant the default schema."""
    with pytest.raises(ValueError) as info:
        fencepost.open("postgresql+psycopg://someone@127.0.0.1:1/db?application_name=a#b&schema=")
    assert "schema is given without a value" in str(info.value)


def test_the_cli_refuses_it_as_a_usage_error_and_creates_nothing(tmp_path) -> None:
    from tests.cli.conftest import fencepost_exe

    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    done = subprocess.run([fencepost_exe(), "--db", "sqlite:///jobs?#a=1", "init"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stderr.startswith("Error: --db: ") and "%23" in done.stderr
    assert list(tmp_path.iterdir()) == []
