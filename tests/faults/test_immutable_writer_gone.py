"""A reader of a SQLite file in a directory it may not write opens it as immutable (no locks, no
``-shm`` index) and, before each read, looks for a ``-shm`` file: a writer that came along. A writer
that came and went between two reads (opened the store, committed, closed it: SQLite checkpoints the
log into the file and deletes ``-wal`` and ``-shm`` as the last connection closes) left no ``-shm``
behind, so the reader kept its immutable connection over a file that had changed under it."""

from __future__ import annotations

import os

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


def test_a_reader_through_a_link_in_an_unwritable_directory_sees_a_writer_that_has_the_file_open(
        copy) -> None:  # noqa: F811
    """SQLite only (immutable reads are SQLite's). The link's directory is one the reader may not
    write; the file it points to is in one it may. SQLite keeps ``-wal``/``-shm`` beside the file
    the link points to, so that is where the reader looks for them and whether it may write there
    is what counts: a writer holding the file open, its latest commit still in the log, is seen
    (an immutable read of the file alone missed run ``r2``)."""
    import shutil
    import tempfile
    from pathlib import Path

    copy.protect("none")  # owned by nobody, who may write its directory
    links = Path(tempfile.mkdtemp(prefix="fencepost-rolink-"))
    try:
        (links / "flows.db").symlink_to(copy.path)
        shutil.chown(links, 65534, 65534)
        os.chmod(links, 0o555)
        with fencepost.open(f"{copy.url}?checkpoints=writer") as writer:  # commits stay in the log
            writer.runs.create("r2", "{}")
            for sidecar in ("flows.db-wal", "flows.db-shm"):
                os.chmod(copy.home / sidecar, 0o666)
            with reader_as_nobody(f"sqlite:///{links / 'flows.db'}") as go:
                seen = go()
        assert seen == [["r1", "r2"], ["r1", "r2"], "pending"]
    finally:
        os.chmod(links, 0o755)
        shutil.rmtree(links, ignore_errors=True)
