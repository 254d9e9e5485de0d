"""A SQLite store its reader may read but not write: the read commands and read-only opens read it.

SQLite only by nature (a file's and a directory's permissions; PostgreSQL's read-only role is
``init``'s and the console's business, tested there). Defect: with the file in a directory the
reader may not write (an auditor handed a copy, a 0555 directory), every read command and
``fencepost.open(url, readonly=True)`` failed with ``permission_denied`` [SQLITE_READONLY_DIRECTORY]:
a WAL database is read through its ``-shm`` index, which SQLite could not create there. Only ``init``
and ``migrations`` read such a file (as immutable). Now every read-only open does, when no ``-shm``
is beside the file and its ``-wal`` log holds nothing; writes are refused with the cause named and
change nothing. Run in a forked process without root's override of permissions (uid ``nobody``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

import fencepost
from tests.cli.test_migrations_cli import _cli_in_process
from tests.faults.conftest import reader_as_nobody, unprivileged

READS = (
    ["runs", "list"],
    ["runs", "show", "r1"],
    ["feed", "tail"],
    ["journal", "show", "r1"],
    ["journal", "replay", "r1"],
    ["journal", "verify"],
    ["source", "show"],
    ["migrations", "status"],
)


def _files(home: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(home.iterdir())}


class ReadOnlyCopy:
    """A store with run ``r1`` and one journal entry in a fresh directory under /tmp (reachable by
    any user), owned by ``nobody``; ``protect(place)`` makes the file 0444 or the directory 0555."""

    def __init__(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="fencepost-rocopy-"))
        self.path = self.home / "flows.db"
        self.url = f"sqlite:///{self.path}"
        with fencepost.open(self.url) as store:
            store.runs.create("r1", '{"step": 1}')
            store.journal.append_unfenced("r1", "noted", {"n": 1}, source_id="audit")
        # Walk the same code here first: the unprivileged child may not be able to read the
        # interpreter's own library to import what it needs.
        warm = tempfile.mkdtemp(prefix="fencepost-warm-")
        try:
            with fencepost.open(f"sqlite:///{warm}/flows.db") as store:
                store.runs.create("r1", "{}")
            for args in [*READS, ["runs", "cancel", "r1"]]:
                _cli_in_process(["--db", f"sqlite:///{warm}/flows.db", *args])
        finally:
            shutil.rmtree(warm)

    def protect(self, place: str) -> None:
        os.chmod(self.home, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.home, 65534, 65534)
            shutil.chown(self.path, 65534, 65534)
        os.chmod(self.path, 0o444) if place == "file" else os.chmod(self.home, 0o555)

    def close(self) -> None:
        os.chmod(self.home, 0o755)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def copy():
    made = ReadOnlyCopy()
    yield made
    made.close()


@pytest.mark.parametrize("place", ["file", "directory"])
def test_read_commands_read_a_store_they_may_not_write(copy, place) -> None:
    copy.protect(place)
    before = _files(copy.home)
    for args in READS:
        code, out, err = unprivileged(_cli_in_process, ["--db", copy.url, *args])
        assert (code, err) == (0, ""), (args, code, out, err)
        if args[0] in ("runs", "feed"):
            assert "r1" in out, (args, out)
    code, out, err = unprivileged(_cli_in_process, ["--db", copy.url, "journal", "show", "r1"])
    assert "noted" in out, out
    # A write is refused, names the cause, and changes nothing.
    code, out, err = unprivileged(_cli_in_process, ["--db", copy.url, "runs", "cancel", "r1"])
    assert code == 1 and err.startswith("Error: permission_denied:"), (code, out, err)
    assert str(copy.path) in err and "for writing" in err, err
    if place == "directory":
        assert _files(copy.home) == before


def _read_and_try_to_write(url: str) -> tuple[str, int, bool, str]:
    with fencepost.open(url, readonly=True) as store:
        status = store.runs.get("r1").status
        position = store.feed.position()
        verified = fencepost.journal.verify(store).ok
        try:
            store.runs.create("r2", "{}")
            refused = "written"
        except fencepost.FencepostError as exc:
            refused = str(exc)
        return status, len(list(store.feed.iter_runs())), verified, refused + f" @{position}"


@pytest.mark.parametrize("place", ["file", "directory"])
def test_a_read_only_open_reads_a_store_it_may_not_write(copy, place) -> None:
    copy.protect(place)
    before = _files(copy.home)
    status, runs, verified, refused = unprivileged(_read_and_try_to_write, copy.url)
    assert (status, runs, verified) == ("pending", 1, True)
    assert "read-only" in refused, refused
    if place == "directory":
        assert _files(copy.home) == before
    with fencepost.open(copy.url, readonly=True) as store:
        assert [r.run_id for r in store.feed.iter_runs()] == ["r1"]


def test_a_writable_open_of_a_store_in_a_directory_it_may_not_write_is_refused_naming_the_cause(copy) -> None:
    copy.protect("directory")

    def open_writable(url: str) -> tuple[str, str]:
        try:
            fencepost.open(url).close()
        except fencepost.OpenError as exc:
            return exc.code, str(exc)
        return "opened", ""

    code, text = unprivileged(open_writable, copy.url)
    assert code == "permission_denied" and "for writing" in text and str(copy.path) in text, text


def test_a_copy_with_commits_still_in_its_log_is_refused_not_read_without_them(copy) -> None:
    """Reading the file alone would miss the log's commits; without a ``-shm`` index SQLite cannot
    read the log in a directory it may not write. Refused, as on read-only media."""
    import sqlite3

    conn = sqlite3.connect(copy.path)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE only_in_the_log (x)")
    conn.commit()
    other = copy.home / "copied"
    other.mkdir()
    shutil.copy(copy.path, other / "flows.db")
    shutil.copy(f"{copy.path}-wal", other / "flows.db-wal")
    conn.close()
    for f in os.listdir(copy.home):
        if f != "copied":
            os.remove(copy.home / f)
    for f in os.listdir(other):
        os.rename(other / f, copy.home / f)
    other.rmdir()
    assert (copy.home / "flows.db-wal").stat().st_size > 0
    copy.protect("directory")

    def reads(url: str) -> tuple[str, str | None]:
        try:
            fencepost.open(url, readonly=True).close()
        except fencepost.OpenError as exc:
            return exc.code, exc.db_code
        return "opened", None

    assert unprivileged(reads, copy.url) == ("permission_denied", "SQLITE_CANTOPEN")


def test_a_reader_of_an_unwritable_directory_sees_a_writer_that_comes_along(copy) -> None:
    """The trade-off of reading without the ``-shm`` index: SQLite takes no locks then, and would
    neither see a writer's later commits nor notice its checkpoints rewriting pages under a read.
    So a read that starts after a ``-shm`` file appeared beside the database (someone who may write
    the directory opened it) reads through a new connection the usual way, and sees the commits."""
    copy.protect("directory")
    with reader_as_nobody(copy.url) as go:
        with fencepost.open(copy.url) as writer:  # root may write the directory
            writer.runs.create("r2", "{}")
            assert (copy.home / "flows.db-shm").exists()
            seen = go()  # the writer keeps its store open meanwhile
    assert seen == [["r1"], ["r1", "r2"], "pending"]


def test_a_read_only_open_reads_the_file_whose_path_has_uri_characters(tmp_path: Path) -> None:
    """A read-only open hands SQLite a ``file:`` URI; a path holding ``#``, ``%`` or a space was put
    in it unquoted, so SQLite opened another path (``#`` starts a URI's fragment): a store at
    ``/data/x#1/flows.db`` was "not a migrated fencepost store". The path is now quoted."""
    home = tmp_path / "a#b %41 c"
    home.mkdir()
    url = f"sqlite:///{home}/flows.db".replace("%", "%25")
    with fencepost.open(url) as store:
        store.runs.create("r1", "{}")
    with fencepost.open(url, readonly=True) as store:
        assert store.runs.get("r1").status == "pending"
    assert sorted(os.listdir(tmp_path)) == ["a#b %41 c"]
