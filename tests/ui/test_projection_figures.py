"""The console's projection figures are the library's and the CLI's for the same store.

The Projections and Health pages and the ``stats`` event show, for each projection checkpointed on
the store's database, the figures ``ProjectionBuilder.status()`` (and ``fencepost projection
status``) computes: after a catch-up with writes since, after a rebuild, after a rotation of the
source, and with a table of the projection dropped. The console serves one database at a time (no
separate projection target), so a projection kept on another database is not on its pages.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from fencepost.projections import OwnershipHistory, ProjectionBuilder, RunsByStatus
from fencepost.ui import views
from tests.cli.conftest import run_cli_in_process  # noqa: F401 - the in-process CLI fixture

from .conftest import PENDING, TESTER


@pytest.fixture
def run_cli(run_cli_in_process):  # noqa: F811
    """``projection status --json`` through ``fencepost.cli.main`` in-process: its figures are
    what is compared, not the process."""
    return run_cli_in_process


FIELDS = ("source", "applied_revision", "current_source", "source_revision", "lag", "applied", "rejected",
          "rebuilds", "pending_rebuild")


def _write(store, prefix: str, n: int) -> None:
    for i in range(n):
        run_id = f"{prefix}-{i}"
        store.runs.create(run_id, '{"flowName": "figures"}')
        if i % 2:
            store.runs.claim_and_own(run_id, PENDING, TESTER, store.clock.now_ms())


def _console(store) -> dict[str, dict]:
    return {p["name"]: {k: p[k] for k in FIELDS} for p in views.projections(store)}


def _library(store, url: str) -> dict[str, dict]:
    out = {}
    for projection in (RunsByStatus(), OwnershipHistory()):
        with ProjectionBuilder(store, url, projection) as builder:
            status = builder.status()
        out[status.name] = {k: getattr(status, k) for k in FIELDS}
    return out


def _cli(run_cli, url: str) -> dict[str, dict]:
    out = {}
    for name in ("runs_by_status", "ownership_history"):
        result = run_cli("--db", url, "projection", "status", "--name", name, "--json")
        assert result.code == 0, result.err
        data = json.loads(result.out)
        out[name] = {k: data[k] for k in FIELDS}
    return out


def _agree(store, url: str, run_cli) -> dict[str, dict]:
    shown = _console(store)
    assert shown == _library(store, url) == _cli(run_cli, url)
    stats = views.stats(store, _NoHub())
    assert {p["name"]: p["lag"] for p in stats["projections"]} == {n: p["lag"] for n, p in shown.items()}
    return shown


class _NoHub:
    """What ``views.health`` reads of a hub, for a console that has not sampled any writes yet."""

    subscribers = 0
    position = None
    error = None

    def rates(self):
        return None, None


def test_console_projection_figures_are_the_cli_and_library_figures(store, db_url, run_cli):
    _write(store, "a", 12)
    for projection in (RunsByStatus(), OwnershipHistory()):
        with ProjectionBuilder(store, db_url, projection) as builder:
            builder.catch_up()
    _write(store, "b", 5)  # five runs created, two of them claimed: seven revisions of lag

    shown = _agree(store, db_url, run_cli)
    assert shown["runs_by_status"]["lag"] == 7 and shown["runs_by_status"]["pending_rebuild"] is None
    assert 0 < shown["ownership_history"]["lag"] < shown["ownership_history"]["source_revision"]

    with ProjectionBuilder(store, db_url, RunsByStatus()) as builder:
        builder.rebuild()
    _write(store, "c", 3)
    shown = _agree(store, db_url, run_cli)
    assert (shown["runs_by_status"]["lag"], shown["runs_by_status"]["rebuilds"]) == (4, 1)

    store.feed.rotate_source()
    shown = _agree(store, db_url, run_cli)
    assert all(p["pending_rebuild"] == "source_changed" and p["lag"] == p["source_revision"]
               for p in shown.values())

    with ProjectionBuilder(store, db_url, RunsByStatus()) as builder:
        builder.catch_up()
    shown = _agree(store, db_url, run_cli)
    assert (shown["runs_by_status"]["lag"], shown["runs_by_status"]["pending_rebuild"]) == (0, None)
    assert shown["ownership_history"]["pending_rebuild"] == "source_changed"


@pytest.mark.parametrize("table", ["projection_runs_by_status", "projection_ownership_history"])
def test_console_says_a_dropped_projection_table_is_rebuilt_as_the_cli_does(store, db_url, run_cli, table):
    _write(store, "a", 6)
    for projection in (RunsByStatus(), OwnershipHistory()):
        with ProjectionBuilder(store, db_url, projection) as builder:
            builder.catch_up()
    shown = _agree(store, db_url, run_cli)
    assert all(p["lag"] == 0 and p["pending_rebuild"] is None for p in shown.values())

    store.db.write(lambda conn: conn.execute(text(f"DROP TABLE {table}")))
    shown = _agree(store, db_url, run_cli)
    dropped = table.removeprefix("projection_")
    assert shown[dropped]["pending_rebuild"] == "table_missing"
    assert all(p["pending_rebuild"] is None for n, p in shown.items() if n != dropped)
