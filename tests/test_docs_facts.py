"""Facts the backends page states, pinned to the code so a new code or option cannot go undocumented
(the pages' samples run elsewhere: tests/test_docs_samples.py and each area's test_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import fencepost
from fencepost._durable import _OWN_OPTIONS
from fencepost.cli._common import error_text
from fencepost.errors import OpenCode
from fencepost.testing import limit_pages

BACKENDS = Path(__file__).resolve().parents[1] / "docs" / "concepts" / "backends.md"


def _first_column(heading: str) -> set[str]:
    """The backticked names in the first column of the table whose header row starts ``| heading |``."""
    lines = BACKENDS.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {heading} |"))
    names: set[str] = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        first = line.strip("|").split("|")[0]
        names.update(re.findall(r"^\s*`(\w+)`", first))
    return names


def test_the_open_error_table_lists_every_code_open_raises() -> None:
    assert _first_column("`code`") == set(get_args(OpenCode))


def test_the_url_option_table_lists_every_fencepost_option() -> None:
    assert _first_column("option") == set(_OWN_OPTIONS)


def test_the_cli_error_line_for_a_full_disk_is_what_the_cli_prints(tmp_path) -> None:
    """SQLite only: the page's example is a SQLite full disk (``limit_pages`` caps the file)."""
    with fencepost.open(f"sqlite:///{tmp_path / 'flows.db'}") as store:
        store.runs.create("small", "{}")
        with store.db.engine.connect() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
        limit_pages(store, pages)
        try:
            store.runs.create("big", '{"x": "' + "y" * 200_000 + '"}')
        except fencepost.RunStoreError as exc:
            line = f"Error: {error_text(exc)}"
        else:
            raise AssertionError("a capped file took a 200 kB run")
    assert f"`{line}`" in BACKENDS.read_text(encoding="utf-8"), line
