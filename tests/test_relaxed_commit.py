"""``Database.write(durable=False)``: a commit that does not wait for the disk, for that write only.

SQLite at ``synchronous`` FULL (the default) runs such a transaction at NORMAL and is back at FULL
afterwards, whether the body committed or raised; PostgreSQL turns ``synchronous_commit`` off for
that transaction alone. A nested write keeps the outer transaction's setting, and such a write
never shares its COMMIT with concurrent (durable) writes.
"""

from __future__ import annotations

import threading

import pytest

import fencepost
from fencepost._durable import Database


def _level(conn) -> str:
    if conn.dialect.name == "sqlite":
        return {0: "off", 1: "relaxed", 2: "durable", 3: "durable"}[conn.exec_driver_sql("PRAGMA synchronous").scalar()]
    return {"off": "relaxed", "on": "durable"}[conn.exec_driver_sql("SHOW synchronous_commit").scalar()]


def test_relaxed_write_commits_and_only_that_transaction_is_relaxed(store: fencepost.Store) -> None:
    db = store.db
    db.write(lambda c: c.exec_driver_sql("CREATE TABLE IF NOT EXISTS witness (n INTEGER NOT NULL)"))

    def body(conn) -> str:
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (1)")
        return _level(conn)

    assert db.write(body, durable=False) == "relaxed"
    assert db.write(_level) == "durable"
    assert db.write(_level, durable=True) == "durable"
    assert db.read(lambda c: c.exec_driver_sql("SELECT n FROM witness").scalars().all()) == [1]


def test_relaxed_write_that_raises_rolls_back_and_restores_the_level(store: fencepost.Store) -> None:
    db = store.db
    db.write(lambda c: c.exec_driver_sql("CREATE TABLE IF NOT EXISTS witness (n INTEGER NOT NULL)"))

    def failing(conn) -> None:
        conn.exec_driver_sql("INSERT INTO witness (n) VALUES (1)")
        raise ValueError("refused")

    with pytest.raises(ValueError):
        db.write(failing, durable=False)
    assert db.write(_level) == "durable"
    assert db.read(lambda c: c.exec_driver_sql("SELECT count(*) FROM witness").scalar()) == 0


def test_nested_relaxed_write_keeps_the_outer_transaction_durable(store: fencepost.Store) -> None:
    db = store.db
    assert db.write(lambda conn: db.write(_level, durable=False)) == "durable"


def test_sqlite_level_below_full_is_left_as_configured(tmp_path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'off.db'}?synchronous=OFF")
    try:
        assert db.write(_level, durable=False) == "off"
        assert db.write(_level) == "off"
    finally:
        db.dispose()


def test_relaxed_write_never_shares_a_commit_with_concurrent_writes(store: fencepost.Store) -> None:
    """Durable writes of other threads, racing relaxed ones, each run at the durable level."""
    db = store.db
    levels: list[str] = []
    relaxed: list[str] = []
    start = threading.Barrier(5)

    def durable_writer() -> None:
        start.wait()
        for _ in range(20):
            levels.append(db.write(_level))

    def relaxed_writer() -> None:
        start.wait()
        for _ in range(20):
            relaxed.append(db.write(_level, durable=False))

    threads = [threading.Thread(target=durable_writer) for _ in range(4)] + [threading.Thread(target=relaxed_writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert levels == ["durable"] * 80
    assert relaxed == ["relaxed"] * 20
