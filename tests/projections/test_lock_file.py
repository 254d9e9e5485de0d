"""The SQLite builder lock's file is kept after the builder closes, and reused, never multiplied.

SQLite only: a PostgreSQL target's lock is a session advisory lock, with no file. Removing the file
on close is unsafe (see docs/concepts/projections.md): a builder still waiting on the unlinked
file's inode and a third that creates a new file would both hold "the lock". This pins that the
file stays one, empty, with the same inode, however many builders come and go.
"""

from __future__ import annotations

import os

import pytest

import fencepost
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus


def _lock_files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".projection-" in p.name and p.name.endswith(".lock"))


def test_the_lock_file_is_reused_by_every_builder_of_one_name(tmp_path):
    source = tmp_path / "source.db"
    target = tmp_path / "target.db"
    with fencepost.open(f"sqlite:///{source}") as store:
        inodes = set()
        for _ in range(3):
            with ProjectionBuilder(store, f"sqlite:///{target}", RunsByStatus()) as builder:
                builder.catch_up()
                [name] = _lock_files(tmp_path)
                with pytest.raises(ProjectionError) as caught:  # held while the builder is open
                    with ProjectionBuilder(store, f"sqlite:///{target}", RunsByStatus()) as second:
                        second.catch_up()
                assert caught.value.code == "builder_busy"
            assert _lock_files(tmp_path) == [name]  # kept after close, still one
            stat = os.stat(tmp_path / name)
            assert stat.st_size == 0  # a lock only: nothing is written to it
            inodes.add(stat.st_ino)
        assert len(inodes) == 1
