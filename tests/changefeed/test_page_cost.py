"""A page of the change feed reads about as many rows as it returns, however many runs there are.

Defect (PostgreSQL): while the tables had no statistics (a store just filled, restored, or written
faster than autovacuum analyses it), the planner guessed how many changes a page's revision range
holds and read every change (``changes_since``: a scan and a sort of the whole change table) or
every change and every run (``changes_with_snapshots``: a hash join over both tables) for each
page. With 100,000 runs a page of 500 changes from the start took 17 ms and 100 ms where it takes
under 1 ms, for every page of a consumer catching up or a projection's first build; a tail page
of five changes with its snapshots took 15 ms instead of 0.03 ms.

Measured without a clock: the statements a page runs are captured and run again, on PostgreSQL
under ``EXPLAIN ANALYZE`` counting the rows each plan node read (autovacuum off, so the tables keep
no statistics, as a busy or freshly loaded table's), on SQLite counting the virtual machine
instructions they execute with 200 settled runs against 2,200.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

import fencepost
from fencepost.changefeed.types import Position
from tests.conftest import pg_rows_read, replayed_instructions, settle_many

LIMIT = 50


def _pages(store: fencepost.Store) -> tuple[list[tuple[str, Any]], list[Any]]:
    """The SELECTs one page of each kind ran (from the start and at the tail), and what they returned."""
    seen: list[tuple[str, Any]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _many) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "flows_run_changes" in statement:
            seen.append((statement, parameters))

    at = store.feed.position()
    start, tail = Position(at.source, 0), Position(at.source, at.revision - 5)
    event.listen(store.db.engine, "before_cursor_execute", capture)
    try:
        got = [store.feed.changes_since(start, LIMIT), store.feed.changes_since(tail, LIMIT),
               store.feed.changes_with_snapshots(start, LIMIT), store.feed.changes_with_snapshots(tail, LIMIT)]
    finally:
        event.remove(store.db.engine, "before_cursor_execute", capture)
    assert seen, "the pages ran no statement on flows_run_changes"
    return seen, got


def _check_answers(store: fencepost.Store, got: list[Any]) -> None:
    at = store.feed.position()
    head, tail, head_snap, tail_snap = got
    assert [c.revision for c in head.changes] == list(range(1, LIMIT + 1)) and head.has_more
    assert [c.revision for c in tail.changes] == list(range(at.revision - 4, at.revision + 1))
    assert not tail.has_more and tail.next_revision == at.revision
    assert [c.revision for c in head_snap.changes] == [c.revision for c in head.changes]
    assert [c.revision for c in tail_snap.changes] == [c.revision for c in tail.changes]
    for page in (head_snap, tail_snap):
        assert [(s.run_id, s.revision) for s in page.snapshots] == [(c.run_id, c.revision) for c in page.changes]


def test_feed_pages_read_what_they_return_not_every_run(store: fencepost.Store, backend: str) -> None:
    if backend == "postgresql":
        for table in ("flows_runs", "flows_run_changes"):
            store.db.write(lambda conn, t=table: conn.exec_driver_sql(
                f"ALTER TABLE {t} SET (autovacuum_enabled = off)"))
    settle_many(store, 0, 200)
    statements, got = _pages(store)
    _check_answers(store, got)
    if backend == "sqlite":
        few = replayed_instructions(store, statements)
        settle_many(store, 200, 2000)
        statements, got = _pages(store)
        _check_answers(store, got)
        many = replayed_instructions(store, statements)
        assert many <= few * 1.5, (few, many)
    else:
        settle_many(store, 200, 2800)
        statements, got = _pages(store)
        _check_answers(store, got)
        # Four pages of at most LIMIT + 1 changes (the watermark reads no change): a change and its
        # run row each, with room for an index's look past the last row.
        read = pg_rows_read(store, statements)
        assert read <= 4 * 2 * (LIMIT + 1) + 40, read


@pytest.mark.parametrize("limit", [1, 2, 7])
def test_a_page_cut_short_by_the_limit_or_the_watermark_is_the_same_page(store: fencepost.Store,
                                                                          limit: int) -> None:
    """The limit and the watermark bound a page together: every page, from every position, is the
    run of changes after it, cut at the limit (``has_more`` when more follow) or at the watermark."""
    for i in range(6):
        store.runs.create(f"r{i}", "{}")
    store.runs.delete("r2")  # a tombstone among them
    at = store.feed.position()
    everything = store.feed.changes_since(Position(at.source, 0), 1000).changes
    for after in range(0, at.revision + 1):
        want = [c for c in everything if c.revision > after]
        page = store.feed.changes_since(Position(at.source, after), limit)
        snap = store.feed.changes_with_snapshots(Position(at.source, after), limit)
        assert [c.revision for c in page.changes] == [c.revision for c in want[:limit]], after
        assert [c.revision for c in snap.changes] == [c.revision for c in want[:limit]], after
        assert page.has_more == snap.has_more == (len(want) > limit), after
        assert page.next_revision == snap.next_revision == (page.changes[-1].revision if page.has_more
                                                             else at.revision), after
