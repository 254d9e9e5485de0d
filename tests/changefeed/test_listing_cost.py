"""Listing the rounds of one lineage reads that lineage, however many runs the store holds.

Defect (both backends, with or without table statistics): the ``lineage_id`` filter of
``list_runs`` and ``count_runs`` compared ``coalesce(lineage_id, run_id)`` with the lineage, an
expression no index holds, so every call read every run: 50,000 rows on PostgreSQL with 50,000
runs (analysed or not) and SQLite's instructions grew with the table (11,732 at 2,000 runs,
290,132 at 50,000). The filter is now written as the two cases it stands for (a run naming the
lineage, or the lineage's first run, which names none), each answered by an index.

Measured without a clock, as the other cost tests: the statements a call sends are captured and
run again, on PostgreSQL under ``EXPLAIN ANALYZE`` counting the rows read (autovacuum off), on
SQLite counting the virtual machine instructions with 200 runs against 2,200.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

import fencepost
from tests.conftest import pg_rows_read, replayed_instructions, settle_many


def _lineage(store: fencepost.Store) -> None:
    """A lineage of three rounds (``root``, then ``root-1``, ``root-2``) and a run of its own."""
    store.runs.create("root", "{}")
    store.runs.create("root-1", "{}", parent_run_id="root", lineage_id="root", round_ordinal=1)
    store.runs.create("root-2", "{}", parent_run_id="root-1", lineage_id="root", round_ordinal=2)
    store.runs.create("alone", "{}")


def _calls(store: fencepost.Store) -> tuple[list[tuple[str, Any]], list[Any]]:
    """The SELECTs the lineage listings and count ran, and what they returned."""
    seen: list[tuple[str, Any]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _many) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "flows_runs" in statement:
            seen.append((statement, parameters))

    event.listen(store.db.engine, "before_cursor_execute", capture)
    try:
        got = [
            [r.run_id for r in store.feed.list_runs({"lineage_id": "root"}, limit=2).runs],
            [r.run_id for r in store.feed.list_runs({"lineage_id": "root"}, newest_first=True).runs],
            [r.run_id for r in store.feed.list_runs({"lineage_id": "alone"}).runs],
            [r.run_id for r in store.feed.list_runs({"lineage_id": "root-1"}).runs],
            store.feed.count_runs({"lineage_id": "root"}),
        ]
    finally:
        event.remove(store.db.engine, "before_cursor_execute", capture)
    assert seen, "the listings ran no statement on flows_runs"
    return seen, got


def _check(got: list[Any]) -> None:
    # "root-1" names a lineage but is none: no run has it as its lineage, and it has one of its own.
    assert got == [["root", "root-1"], ["root-2", "root-1", "root"], ["alone"], [], 3]


def test_a_lineage_listing_reads_the_lineage_not_every_run(store: fencepost.Store, backend: str) -> None:
    if backend == "postgresql":
        for table in ("flows_runs", "flows_run_changes"):
            store.db.write(lambda conn, t=table: conn.exec_driver_sql(
                f"ALTER TABLE {t} SET (autovacuum_enabled = off)"))
    _lineage(store)
    settle_many(store, 0, 200)
    statements, got = _calls(store)
    _check(got)
    if backend == "sqlite":
        few = replayed_instructions(store, statements)
        settle_many(store, 200, 2000)
        statements, got = _calls(store)
        _check(got)
        many = replayed_instructions(store, statements)
        assert many <= few * 1.5, (few, many)
    else:
        settle_many(store, 200, 2800)
        statements, got = _calls(store)
        _check(got)
        # Five calls over a lineage of three runs: its rows, their changes and an index's look past
        # them, nowhere near the 3,004 runs.
        read = pg_rows_read(store, statements)
        assert read <= 120, read
