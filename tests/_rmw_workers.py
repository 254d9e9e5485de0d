"""Worker processes for test_durable_writer.py (module-level so 'spawn' children can import them)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

import fencepost


def bump_worker(url: str, rounds: int, barrier: Any, out: Any) -> None:
    """Read the counter, write it back plus one, ``rounds`` times; report how often a body ran."""
    calls = 0

    def bump(conn: Any) -> None:
        nonlocal calls
        calls += 1
        n = conn.exec_driver_sql("SELECT n FROM counter").scalar()
        conn.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})

    with fencepost.open(url) as store:
        barrier.wait()
        for _ in range(rounds):
            store.db.write(bump)
    out.put(calls)
