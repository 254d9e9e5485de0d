"""A full disk under ``fencepost.open``: a fresh store's first migration pass, and the pending
migrations of an older store, meet a real full disk (a small tmpfs).

Covers the pairs nothing else did: full disk x migration on open (fresh file; an existing store with
migrations pending). The open fails with ``disk_full`` naming the path, nothing of the migration
pass lands (it is one transaction: the ledger is empty or exactly what it was), and once space is
back a plain open migrates and writes.

Defect: with just enough room for the database file but not for the log's shared-memory index
(``-shm``), SQLite answered ``SQLITE_IOERR_SHMSIZE`` (its code for an index that could not grow,
"usually a full disk") and the open said ``open_failed ... disk I/O error`` instead of
``disk_full``. SQLite only: a PostgreSQL server's disk is the server's own.
"""

from __future__ import annotations

import sqlite3

import pytest

import fencepost
from fencepost._migrations import STORE_NAMESPACES, discover
from tests.cli.conftest import assert_one_line_error
from tests.conftest import back_to_4001, ledger_of

pytestmark = pytest.mark.slow

ALL = {m.id for m in discover("sqlite", STORE_NAMESPACES)}
# Free room left on the disk: none, room for a page or a few (the -shm index cannot grow: the
# defect), and more, where the log itself runs out.
ROOMS = (0, 8192, 16384, 32768, 65536)


def _tables(path) -> set[str]:
    if not path.exists() or path.stat().st_size == 0:
        return set()
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as raw:
        return {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_fresh_store_on_a_full_disk_is_disk_full_and_nothing_of_it_is_migrated(small_disk) -> None:
    if not small_disk.mounted:
        pytest.skip("needs a tmpfs (the page cap applies to an open store only)")
    seen = {}
    for room in ROOMS:
        path = small_disk.root / f"flows-{room}.db"
        small_disk.fill_leaving(room)
        try:
            with pytest.raises(fencepost.OpenError) as caught:
                fencepost.open(f"sqlite:///{path}").close()
        finally:
            small_disk.free()
        seen[room] = (caught.value.code, getattr(caught.value, "db_code", None))
        assert str(path) in str(caught.value)
        assert _tables(path) == set(), room  # nothing of the migration pass landed
        with fencepost.open(f"sqlite:///{path}") as store:  # space is back: it migrates and writes
            store.runs.create("after", "{}")
            assert store.runs.get("after").status == "pending"
        assert ledger_of(f"sqlite:///{path}") == ALL
    assert {room: code for room, (code, _) in seen.items()} == dict.fromkeys(ROOMS, "disk_full"), seen


def test_pending_migrations_on_a_full_disk_leave_the_ledger_as_it_was(small_disk) -> None:
    url = small_disk.url()
    with fencepost.open(url) as store:
        store.runs.create("kept", "{}")
    back_to_4001(url)
    before = ledger_of(url)
    assert before == ALL - {4002, 4003, 4004}
    if not small_disk.mounted:
        pytest.skip("needs a tmpfs (the page cap applies to an open store only)")
    small_disk.fill_leaving(0)
    try:
        with pytest.raises(fencepost.OpenError) as caught:
            fencepost.open(url).close()
    finally:
        small_disk.free()
    assert caught.value.code == "disk_full", caught.value
    assert ledger_of(url) == before  # the pass is one transaction: none of 4002, 4003, 4004 recorded
    with fencepost.open(url) as store:
        assert ledger_of(url) == ALL
        assert store.runs.get("kept").status == "pending"
        store.runs.create("after", "{}")


def test_reading_a_closed_store_on_a_full_disk_says_the_disk_is_full(small_disk, run_cli) -> None:
    """A store every process has closed (no ``-shm`` left) on a disk that then filled: a read needs
    the index back, and SQLite cannot create it (``SQLITE_IOERR_SHMSIZE``). The read-only open and
    ``fencepost runs list`` said "could not be opened; disk I/O error"; they say the disk is full,
    and read again once space is back. The file is untouched."""
    if not small_disk.mounted:
        pytest.skip("needs a tmpfs (the page cap applies to an open store only)")
    url = small_disk.url()
    with fencepost.open(url) as store:
        for n in range(5):
            store.runs.create(f"r{n}", "{}")
    db = small_disk.root / "flows.db"
    assert not db.with_name("flows.db-shm").exists()
    size = db.stat().st_size
    small_disk.fill_leaving(0)
    try:
        with pytest.raises(fencepost.OpenError) as caught:
            fencepost.open(url, readonly=True).close()
        result = run_cli("--db", url, "runs", "list")
    finally:
        small_disk.free()
    assert caught.value.code == "disk_full", caught.value
    assert_one_line_error(result)
    assert "no space left on the disk" in result.err, result.err
    assert db.stat().st_size == size
    with fencepost.open(url, readonly=True) as store:
        assert sorted(r.run_id for r in store.feed.iter_runs()) == [f"r{n}" for n in range(5)]
