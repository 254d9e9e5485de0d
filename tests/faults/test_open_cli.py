"""The CLI shows each open failure's own message, and write failures with the driver's code."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import make_url

import fencepost
from tests.cli.conftest import assert_one_line_error
from tests.conftest import require_postgres
from tests.faults.conftest import unprivileged

pytestmark = pytest.mark.slow


def test_cli_names_each_open_failure(run_cli, tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    cases = {
        f"sqlite:///{junk}": ("is not a SQLite database", "[SQLITE_NOTADB]"),
        f"sqlite:///{tmp_path / 'missing.db'}": ("no database at", "fencepost init"),
        f"sqlite:///{empty}": ("is not a migrated fencepost store", "fencepost init"),
    }
    seen = set()
    for url, wanted in cases.items():
        result = run_cli("--db", url, "runs", "list")
        assert_one_line_error(result)
        assert all(w in result.err for w in wanted), result
        assert "not a fencepost store" not in result.err.replace("not a migrated fencepost store", "")
        seen.add(result.err)
    assert len(seen) == len(cases)


def test_cli_names_postgresql_open_failures_without_the_password(run_cli) -> None:
    base = make_url(require_postgres()).set(password="pw-Secret-77")
    cases = {
        base.set(port=1): "cannot connect to",
        base.set(database="fencepost_no_such_db"): "no database at",
        base.set(username="fencepost_no_such_role"): "authentication or role refused",
    }
    for url, wanted in cases.items():
        result = run_cli("--db", url.render_as_string(hide_password=False), "runs", "list")
        assert_one_line_error(result)
        assert wanted in result.err and "pw-Secret-77" not in result.err and "***" in result.err, result


def test_cli_write_failure_shows_the_driver_code(run_cli, small_disk) -> None:
    if not small_disk.mounted:
        pytest.skip("a CLI process cannot share the page-cap hook: needs a real small filesystem")
    url = small_disk.url()
    store = fencepost.open(url)  # kept open: its WAL stays, so the CLI's open itself needs no space
    try:
        store.runs.create("r1", "{}")
        small_disk.fill(store)
        result = run_cli("--db", url, "runs", "cancel", "r1")
        assert_one_line_error(result)
        assert "persistence failed" in result.err and "[SQLITE_FULL]" in result.err, result
        small_disk.free()
        assert run_cli("--db", url, "runs", "cancel", "r1").code == 0
    finally:
        small_disk.free()
        store.close()


def _cli(args: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    from fencepost.cli import main

    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue()


def test_cli_write_to_a_read_only_file_shows_sqlite_readonly() -> None:
    """The CLI's error boundary in an unprivileged process: the file is 0444."""
    home = Path(tempfile.mkdtemp(prefix="fencepost-rocli-"))
    try:
        path = home / "flows.db"
        store = fencepost.open(f"sqlite:///{path}")
        store.runs.create("r1", "{}")
        store.close()
        os.chmod(path, 0o444)
        os.chmod(home, 0o755)
        if os.geteuid() == 0:
            shutil.chown(home, 65534, 65534)
            shutil.chown(path, 65534, 65534)
        # Walk the same error path here first: the unprivileged child may not be able to read
        # the interpreter's own library to import what it needs.
        assert _cli(["--db", f"sqlite:///{home / 'missing.db'}", "runs", "cancel", "r1"])[0] == 1
        code, err = unprivileged(_cli, ["--db", f"sqlite:///{path}", "runs", "cancel", "r1"])
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 1 and len(lines) == 1, err
        assert "permission denied opening" in lines[0] and "[SQLITE_READONLY]" in lines[0], lines
        with fencepost.open(f"sqlite:///{path}", readonly=True) as ro:
            assert ro.runs.get("r1").status == "pending"
    finally:
        shutil.rmtree(home, ignore_errors=True)
