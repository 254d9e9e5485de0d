"""``fencepost projection`` review findings (CLI side)."""

from __future__ import annotations

import os
import shutil

import pytest

import fencepost
from tests.cli.test_followers import _start

BOUND_S = 30


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_projection_follow_on_a_replaced_sqlite_target_ends_and_says_to_run_it_again(tmp_path, how):
    """Defect (found by a review, SQLite): the read model's file deleted (or another moved over it)
    under ``projection run --follow`` was retried for ever (``catch-up failed (file_replaced);
    retrying``) while status lines went on saying lag 0. It now exits 1 with one line naming the
    target, what happened and what to do (run the command again); running it again builds the
    projection onto the file at that path.

    SQLite only: a PostgreSQL target has no file to replace."""
    source, target = tmp_path / "flows.db", tmp_path / "read.db"
    with fencepost.open(f"sqlite:///{source}") as store:
        store.runs.create("a-0", "{}")
    older = tmp_path / "older.db"
    with fencepost.open(f"sqlite:///{tmp_path / 'other.db'}") as other:
        other.runs.create("other-0", "{}")
        from fencepost.projections import ProjectionBuilder, RunsByStatus
        with ProjectionBuilder(other, f"sqlite:///{older}", RunsByStatus()) as builder:
            builder.catch_up()
    args = ("--db", f"sqlite:///{source}", "projection", "run", "--target", f"sqlite:///{target}")
    proc = _start(*args, "--follow", "--interval", "0.2")
    try:
        assert "lag 0" in proc.stdout.readline()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(f"{target}{suffix}"):
                os.remove(f"{target}{suffix}")
        if how == "replaced":
            shutil.copy(older, target)
        with fencepost.open(f"sqlite:///{source}") as store:
            store.runs.create("b-0", "{}")
        _out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    [line] = err.strip().splitlines()
    assert f"the projection's target {target} was {how} while the projection followed it" in line, line
    assert "run this command again" in line and "retrying" not in err
    again = _start(*args)
    out, err = again.communicate(timeout=BOUND_S)
    assert again.returncode == 0, err
    assert "at revision 2" in out, out


def _combo(make_db_url) -> tuple[str, str, str]:
    """Stores edge (2 runs) and hq (1 run), and a target holding the custom projection ``combo`` fed
    by both and runs_by_status fed by edge alone."""
    from fencepost.projections import ProjectionBuilder, RunsByStatus

    edge_url, hq_url, target = make_db_url(), make_db_url(), make_db_url()
    with fencepost.open(edge_url) as edge, fencepost.open(hq_url) as hq:
        edge.runs.create("e0", "{}")
        edge.runs.create("e1", "{}")
        hq.runs.create("h0", "{}")
        with ProjectionBuilder({"edge": edge, "hq": hq}, target, RunsByStatus(name="combo", table="combo_t")) as b:
            b.catch_up()
        with ProjectionBuilder(edge, target, RunsByStatus()) as b:
            b.catch_up()
    return edge_url, hq_url, target


def test_projection_status_says_a_custom_projection_is_fed_by_several_stores_and_shows_it_with_them(
        run_cli_in_process, make_db_url):
    """Defect (found by a review, SQLite and PostgreSQL): ``projection status --all`` left out a
    custom projection fed by several stores without a word, and ``--name combo`` said no projection
    combo had a checkpoint on the target; with several stores, ``--name`` took the built-in ones only,
    so no command could show it. Now ``--all`` (one store) says below its table which projections are
    fed by several stores and how to show them; ``--name combo`` with one store exits 1 saying so
    (naming its stores); with every store named (``--db edge=URL --db hq=URL --target URL``),
    ``--name combo`` shows each store's status, as its builder's ``status()`` reports it."""
    run_cli = run_cli_in_process
    edge_url, hq_url, target = _combo(make_db_url)
    listed = run_cli("--db", edge_url, "projection", "status", "--all", "--target", target)
    assert listed.code == 0, listed
    assert "runs_by_status" in listed.out
    assert "combo is fed by several stores (edge, hq)" in listed.out, listed.out
    assert "--db edge=URL --db hq=URL" in listed.out, listed.out
    one = run_cli("--db", edge_url, "projection", "status", "--name", "combo", "--target", target)
    assert one.code == 1, one
    assert "no projection combo has a checkpoint" not in one.err
    assert "combo" in one.err and "fed by several stores (edge, hq)" in one.err, one.err
    import json

    shown = run_cli("--db", f"edge={edge_url}", "--db", f"hq={hq_url}", "projection", "status",
                    "--name", "combo", "--target", target, "--json")
    assert shown.code == 0, shown
    rows = {r["store"]: r for r in json.loads(shown.out)}
    assert {k: (r["name"], r["applied_revision"], r["lag"]) for k, r in rows.items()} == {
        "edge": ("combo", 2, 0), "hq": ("combo", 1, 0)}
    # A projection fed by one store, named with several: said as such.
    wrong = run_cli("--db", f"edge={edge_url}", "--db", f"hq={hq_url}", "projection", "status",
                    "--name", "runs-by-status-x", "--target", target)
    assert wrong.code == 1 and "no projection runs-by-status-x" in wrong.err, wrong
