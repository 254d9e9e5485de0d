"""Facts the backends, demo, worker and performance pages state, pinned to the code so a new code or
option cannot go undocumented and a changed default cannot leave the page behind (the pages' samples
run elsewhere: tests/test_docs_samples.py and each area's test_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import fencepost
from fencepost._durable import _OWN_OPTIONS
from fencepost.cli._common import error_text
from fencepost.errors import OpenCode
from fencepost.testing import limit_pages

DOCS = Path(__file__).resolve().parents[1] / "docs"
BACKENDS = DOCS / "concepts" / "backends.md"


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


def test_the_demo_page_states_the_demo_commands_defaults() -> None:
    from fencepost.cli.demo import demo

    defaults = {p.name: p.default for p in demo.params}
    text = " ".join((DOCS / "guides" / "demo.md").read_text(encoding="utf-8").split())
    assert f"**Creates {defaults['n_runs']} runs** (`--runs`)" in text
    assert f"**Starts {defaults['n_workers']} worker processes** (`--workers`)" in text
    assert f"times faster than the wall clock ({defaults['speed']:g} by default)" in text


def test_the_worker_guide_states_the_workers_constants() -> None:
    from fencepost import worker
    from fencepost.cli.worker import START_RETRY_S
    from fencepost.runstore.heartbeat import HEARTBEAT_INTERVAL, STALE_AFTER, WRITE_TOLERANCE

    text = " ".join((DOCS / "guides" / "worker.md").read_text(encoding="utf-8").split())
    assert f"`SUSPEND_BACKOFF_S`, {worker.SUSPEND_BACKOFF_S:g} s" in text
    assert f"`STOP_GRACE_S` ({worker.STOP_GRACE_S:g} s)" in text
    assert f"`WRITE_TOLERANCE` ({WRITE_TOLERANCE.total_seconds():g} s)" in text
    assert f"`HEARTBEAT_INTERVAL` ({HEARTBEAT_INTERVAL.total_seconds():g} s)" in text
    assert f"`STALE_AFTER` ({STALE_AFTER.total_seconds():g} s)" in text
    assert f"backoff of up to {worker._MAX_BACKOFF_S:g} s" in text
    *first, every = START_RETRY_S
    assert f"retries after {', '.join(f'{s:g}' for s in first)} and then every {every:g} seconds" in text


def test_the_performance_guide_states_the_busy_timeout_default_and_limit() -> None:
    from fencepost._dialects import BUSY_TIMEOUT_MS
    from fencepost._durable import _BUSY_TIMEOUT_MAX

    text = (DOCS / "guides" / "performance.md").read_text(encoding="utf-8")
    assert f"The default is {BUSY_TIMEOUT_MS:,}; the largest is {_BUSY_TIMEOUT_MAX:,}." in text
