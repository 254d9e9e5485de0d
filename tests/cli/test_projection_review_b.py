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
