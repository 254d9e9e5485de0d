"""A page of consensus facts reads the journal from its position on, not the whole journal.

Defect (PostgreSQL): while the journal table had no statistics (a store just filled, restored, or
written faster than autovacuum analyses it), the planner guessed that almost no entry is a fact
and read and sorted the whole journal for every page of facts. Where facts are dense (every claim,
activation and settle of a run is one), a first build of an ownership projection then read the
whole journal once per page: 15 ms a page at 50,000 entries, growing with both. With statistics
the same page read 1,000 rows (0.3 ms).

Measured without a clock: the statements of one page are captured and run again in order in one
transaction, the facts query under ``EXPLAIN ANALYZE`` (PostgreSQL, autovacuum off for the
journal), or counted in VM instructions with few and many entries (SQLite).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

import fencepost
from fencepost.journal import OwnerId
from fencepost.projections._feeds import ConsensusFeed
from fencepost.runstore.rows import RunSnapshot
from tests.conftest import plan_nodes, replayed_instructions, scanned_rows

LIMIT = 50
PENDING = RunSnapshot("pending", None, None)
OWNER = OwnerId("host-facts", 3, "facts-nonce")


def _facts(store: fencepost.Store, start: int, n: int) -> None:
    """``n`` runs claimed and owned (ownership facts) with an ordinary entry each."""
    for i in range(start, start + n):
        store.runs.create(f"f-{i:05d}", "{}")
        store.runs.claim_and_own(f"f-{i:05d}", PENDING, OWNER, store.clock.now_ms())
        store.journal.append_unfenced(f"f-{i:05d}", "note", {"i": i}, source_id="app")


def _page(store: fencepost.Store) -> tuple[list[tuple[str, Any]], Any]:
    seen: list[tuple[str, Any]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _many) -> None:
        seen.append((statement, parameters))

    feed = ConsensusFeed(store)
    source, _ = feed.head()
    event.listen(store.db.engine, "before_cursor_execute", capture)
    try:
        page = feed.page(source, 0, LIMIT)
    finally:
        event.remove(store.db.engine, "before_cursor_execute", capture)
    assert page.has_more and len(page.updates) >= LIMIT // 2, page
    return seen, page


def _facts_rows_read(store: fencepost.Store, statements: list[tuple[str, Any]]) -> int:
    """PostgreSQL: the statements run again in order in one transaction, the facts query explained."""

    def replay(conn: Any) -> int:
        cur = conn.connection.dbapi_connection.cursor()
        read = None
        for sql, params in statements:
            if "LIKE" in sql and "flows_journal_events" in sql:
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                read = scanned_rows(plan_nodes(cur.fetchone()[0][0]["Plan"]))
            elif sql.lstrip().upper().startswith("SELECT"):
                cur.execute(sql, params)
                cur.fetchall()
        assert read is not None, "no facts query ran"
        return read

    return store.db.read(replay)


def test_a_facts_page_reads_its_own_facts_not_the_whole_journal(store: fencepost.Store, backend: str) -> None:
    if backend == "postgresql":
        store.db.write(lambda conn: conn.exec_driver_sql(
            "ALTER TABLE flows_journal_events SET (autovacuum_enabled = off)"))
    _facts(store, 0, 60)
    statements, first = _page(store)
    if backend == "sqlite":
        few = replayed_instructions(store, statements)
        _facts(store, 60, 600)
        statements, again = _page(store)
        many = replayed_instructions(store, statements)
        assert many <= few * 1.5, (few, many)
    else:
        _facts(store, 60, 600)
        statements, again = _page(store)
        # The page's facts and the entries between them (an ordinary entry after each run's facts),
        # with room for the index's look past the last one.
        read = _facts_rows_read(store, statements)
        assert read <= 4 * (LIMIT + 1) + 20, read
    assert [u.revision for u in again.updates] == [u.revision for u in first.updates]
    assert again.next_revision == first.next_revision
