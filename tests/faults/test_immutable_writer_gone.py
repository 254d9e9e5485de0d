"""A reader of a SQLite file in a directory it may not write opens it as immutable (no locks, no
``-shm`` index) and, before each read, looks for a ``-shm`` file: a writer that came along. A writer
that came and went between two reads (opened the store, committed, closed it: SQLite checkpoints the
log into the file and deletes ``-wal`` and ``-shm`` as the last connection closes) left no ``-shm``
behind, so the reader kept its immutable connection over a file that had changed under it."""

from __future__ import annotations

import fencepost
from tests.faults.conftest import reader_as_nobody
from tests.faults.test_read_only_copy import copy  # noqa: F401 - fixture


def test_a_reader_of_an_unwritable_directory_sees_a_writer_that_came_and_went(copy) -> None:  # noqa: F811
    copy.protect("directory")
    with reader_as_nobody(copy.url) as go:
        with fencepost.open(copy.url) as writer:  # root may write the directory
            for n in range(2, 40):
                writer.runs.create(f"r{n}", "{}")
        assert not (copy.home / "flows.db-shm").exists()  # gone with the last connection
        seen = go()
    assert seen == [["r1"], sorted(f"r{n}" for n in range(1, 40)), "pending"]
