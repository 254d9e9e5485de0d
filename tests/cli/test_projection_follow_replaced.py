"""``fencepost projection run --follow`` says a replaced SQLite source in a command-line user's terms.

Defect: a source file replaced (or removed) at its path under the follower ended it with the
library's words, ``projection_failed: Projection.run: ... reopen the store at its path (the builder
then rebuilds onto it)``: a user of the command has no store to reopen. It now says what happened
and what to do: run the command again, which follows the database now at that path and rebuilds
the projection from it (checked here: the next ``projection run`` applies the new file's runs).

SQLite only: a PostgreSQL source has no file to replace; a schema dropped and created again under
the builder is read by its next connection, and the builder rebuilds on its own (source_changed).
"""

from __future__ import annotations

import os
import subprocess

import pytest

import fencepost
from tests.cli.conftest import fencepost_exe
from tests.cli.test_followers import _start

BOUND_S = 30


def _store(path, prefix: str, runs: int) -> None:
    with fencepost.open(f"sqlite:///{path}") as store:
        for i in range(runs):
            store.runs.create(f"{prefix}{i}", "{}")


def _swap(new, path) -> None:
    os.replace(new, path)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.remove(f"{path}{suffix}")


@pytest.mark.parametrize("target", ["source", "separate"])
@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_projection_follow_on_a_replaced_sqlite_source_says_to_run_it_again(tmp_path, target, how):
    path = tmp_path / "flows.db"
    _store(path, "old-", 3)
    _store(tmp_path / "new.db", "new-", 5)
    url = f"sqlite:///{path}"
    extra = ["--target", f"sqlite:///{tmp_path / 'read.db'}"] if target == "separate" else []
    proc = _start("--db", url, "projection", "run", "--follow", "--interval", "0.2", *extra)
    try:
        assert "lag 0" in proc.stdout.readline()
        if how == "replaced":
            _swap(tmp_path / "new.db", path)
        else:
            _swap(path, tmp_path / "moved.db")
        _out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert err.count("\n") == 1 and err.startswith("Error: "), err
    assert f"the source database {path} was {how} while the projection followed it" in err, err
    assert "run this command again" in err, err
    assert "reopen the store" not in err and "projection_failed" not in err, err
    if how == "removed":
        return
    # What the message promises: running it again builds the projection from the new file.
    again = subprocess.run([fencepost_exe(), "--db", url, "projection", "run", "--json", *extra],
                           capture_output=True, text=True, timeout=BOUND_S,
                           env={k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"})
    assert again.returncode == 0, again.stderr
    assert '"applied":5' in again.stdout and '"revision":5' in again.stdout, again.stdout
