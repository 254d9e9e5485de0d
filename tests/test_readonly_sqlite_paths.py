"""A read-only SQLite store opens its file through a ``file:`` URI (``mode=ro``, and ``immutable=1``
when nobody has the file open): any path a writable open takes, a read-only one takes too.

SQLite only: PostgreSQL stores have no file path."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

import pytest

import fencepost


@pytest.mark.parametrize("name", ["a?b#c%41 d é.db", "x&mode=rw.db", "plain.db"])
@pytest.mark.parametrize("leading", ["/", "//"])
def test_a_readonly_open_reads_the_file_a_writable_open_made(tmp_path: Path, name: str, leading: str) -> None:
    """A path beginning with two slashes (POSIX keeps them; it names the same file) became
    ``file://tmp/...``: SQLite read its first part as the URI's authority and refused the
    read-only open (``open_failed``) of a store the writable open had made. Characters that mean
    something in a URI (``?``, ``#``, ``%``, ``&``, spaces, non-ASCII) are percent-encoded."""
    directory = tmp_path / "q?#% é"
    directory.mkdir()
    path = directory / name
    url = "sqlite:///" + quote(leading + str(path).lstrip("/"), safe="/")
    with fencepost.open(url) as store:
        store.runs.create("r1", "{}")
    assert path.exists()
    with fencepost.open(url, readonly=True) as store:
        assert store.runs.get("r1").status == "pending"
    # Refused, it leaves the file as it was (the immutable reads decide) and names the path.
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM flows_migrations WHERE migration_id = 1006")
    conn.commit()
    conn.close()
    before = sorted(p.name for p in directory.iterdir())
    with pytest.raises(fencepost.OpenError) as err:
        fencepost.open(url, readonly=True)
    assert err.value.code == "needs_migrations"
    assert sorted(p.name for p in directory.iterdir()) == before
