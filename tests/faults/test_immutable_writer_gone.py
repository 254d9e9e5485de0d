"""A reader of a SQLite file in a directory it may not write opens it as immutable (no locks, no
``-shm`` index) and, before each read, looks for a ``-shm`` file: a writer that came along. A writer
that came and went between two reads (opened the store, committed, closed it: SQLite checkpoints the
log into the file and deletes ``-wal`` and ``-shm`` as the last connection closes) left no ``-shm``
behind, so the reader kept its immutable connection over a file that had changed under it."""

from __future__ import annotations

import os
import pickle

import fencepost
from tests.faults.test_read_only_copy import copy  # noqa: F401 - fixture


def test_a_reader_of_an_unwritable_directory_sees_a_writer_that_came_and_went(copy) -> None:  # noqa: F811
    copy.protect("directory")
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the reader, uid nobody
        try:
            os.close(to_child_w)
            os.close(to_parent_r)
            seen: list = []
            try:
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                with fencepost.open(copy.url, readonly=True) as store:
                    seen.append(sorted(r.run_id for r in store.feed.iter_runs()))
                    os.write(to_parent_w, b"r")
                    os.read(to_child_r, 1)  # the writer has committed and closed its store
                    seen.append(sorted(r.run_id for r in store.feed.iter_runs()))
                    seen.append(store.runs.get("r2").status)
            except BaseException as exc:  # reported to the test
                seen.append(repr(exc))
            os.write(to_parent_w, pickle.dumps(seen))
        finally:
            os._exit(0)
    os.close(to_child_r)
    os.close(to_parent_w)
    try:
        assert os.read(to_parent_r, 1) == b"r"
        with fencepost.open(copy.url) as writer:  # root may write the directory
            for n in range(2, 40):
                writer.runs.create(f"r{n}", "{}")
        assert not (copy.home / "flows.db-shm").exists()  # gone with the last connection
        os.write(to_child_w, b"g")
        data = b""
        while chunk := os.read(to_parent_r, 65536):
            data += chunk
    finally:
        os.waitpid(pid, 0)
    assert pickle.loads(data) == [["r1"], sorted(f"r{n}" for n in range(1, 40)), "pending"]
