"""``changes_with_snapshots`` and ``follow_batches``: pages of changes read with their snapshots."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event, text

import fencepost
from fencepost import Missing, Observed, Position, SourceChanged
from fencepost.errors import RunStoreError
from tests.changefeed.conftest import delete_run, insert_run, update_run


def _seed(store: fencepost.Store, n: int) -> None:
    def body(conn):
        for i in range(n):
            insert_run(conn, f"r-{i:03d}", created=i)
        update_run(conn, "r-001", status="completed", finished_at_ms=9)
        delete_run(conn, "r-002")

    store.db.write(body)


def _pages(store: fencepost.Store, limit: int):
    position = Position(store.feed.position().source, 0)
    while True:
        page = store.feed.changes_with_snapshots(position, limit)
        yield page
        position = page.next_position
        if not page.has_more:
            return


def test_each_page_equals_changes_since_plus_read_of_the_same_state(store):
    _seed(store, 12)
    for limit in (1, 5, 500):
        pages = list(_pages(store, limit))
        changes = [c for p in pages for c in p.changes]
        snapshots = [s for p in pages for s in p.snapshots]
        expected_changes = []
        position = Position(store.feed.position().source, 0)
        while True:
            batch = store.feed.changes_since(position, limit)
            expected_changes.extend(batch.changes)
            position = batch.next_position
            if not batch.has_more:
                break
        assert changes == expected_changes
        # Nothing changed since: a fresh read of each id gives the same snapshot.
        expected = store.feed.read([c.run_id for c in changes]).snapshots
        assert snapshots == expected
        assert [type(s) for s, c in zip(snapshots, changes, strict=True) if c.deleted] == [Missing]
        gone = next(s for s in snapshots if isinstance(s, Missing))
        assert gone.run_id == "r-002" and gone.deleted and gone.revision == changes[-1].revision
        assert all(s.revision == c.revision for s, c in zip(snapshots, changes, strict=True))
        assert pages[-1].next_revision == store.feed.position().revision


def test_one_page_is_one_statement_after_the_watermark_whatever_its_size(store):
    _seed(store, 450)
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args):
        statements.append(statement)

    start = Position(store.feed.position().source, 0)
    event.listen(store.db.engine, "before_cursor_execute", count)
    try:
        page = store.feed.changes_with_snapshots(start, 1000)
    finally:
        event.remove(store.db.engine, "before_cursor_execute", count)
    assert len(page.changes) == 450 and len(page.snapshots) == 450  # a tombstone included
    # The watermark, then the page with its snapshots (no read per 200 ids).
    assert len(statements) == 2, statements


def test_refuses_another_source_a_position_ahead_and_bad_limits(store):
    _seed(store, 3)
    position = store.feed.position()
    with pytest.raises(SourceChanged) as other:
        store.feed.changes_with_snapshots(Position("0" * 32, 0))
    assert other.value.rotated is True  # the position's source is not the store's current one
    with pytest.raises(SourceChanged) as ahead:
        store.feed.changes_with_snapshots(Position(position.source, position.revision + 1))
    assert ahead.value.rotated is False
    for limit in (0, 1001, "5", True):
        with pytest.raises(RunStoreError) as err:
            store.feed.changes_with_snapshots(Position(position.source, 0), limit)
        assert err.value.code == "decode_failed"


def test_a_live_change_without_its_run_row_is_decode_failed(store, backend):
    _seed(store, 3)

    def corrupt(conn):
        # A change row that claims a live run nobody stores (the triggers never write this).
        if backend == "postgresql":
            conn.execute(text("ALTER TABLE flows_run_changes DISABLE TRIGGER USER"))
        conn.execute(text("UPDATE flows_run_changes SET deleted = 0 WHERE run_id = 'r-002'"))

    try:
        store.db.write(corrupt)
    except Exception:
        pytest.skip("the change table refuses the corruption outright")
    with pytest.raises(RunStoreError) as err:
        store.feed.changes_with_snapshots(Position(store.feed.position().source, 0))
    assert err.value.code == "decode_failed"


def test_follow_batches_yields_pages_then_new_commits_until_stopped(store):
    _seed(store, 7)
    stop = threading.Event()
    seen: list[tuple[list[str], list[object]]] = []
    done = threading.Event()

    def consume() -> None:
        for page in store.feed.follow_batches(stop=stop, poll_interval=0.2, limit=3):
            seen.append(([c.run_id for c in page.changes], page.snapshots))
            if sum(len(ids) for ids, _ in seen) in (7, 8):  # the seeded changes, then the late one
                done.set()
        done.set()

    thread = threading.Thread(target=consume)
    thread.start()
    try:
        assert done.wait(30)
        done.clear()
        assert [len(ids) for ids, _ in seen] == [3, 3, 1]
        store.db.write(lambda conn: insert_run(conn, "late", created=99))
        assert done.wait(30)
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    ids, snapshots = seen[-1]
    assert ids == ["late"] and isinstance(snapshots[0], Observed) and snapshots[0].status == "pending"
    assert all(ids for ids, _ in seen)  # never an empty page


def test_follow_batches_refuses_bad_arguments_at_once(store):
    with pytest.raises(RunStoreError):
        store.feed.follow_batches(limit=0)
    with pytest.raises(RunStoreError):
        store.feed.follow_batches(Position("nothex", 0))
    with pytest.raises(ValueError):
        store.feed.follow_batches(poll_interval=0)


# Values a SQLite row can hold once its CHECK constraints are bypassed, beside the ones fencepost
# writes: a page must be accepted or refused exactly as the row statement's driver rows would be.
_ODD_SQLITE_VALUES = {
    "real in an integer column": "UPDATE flows_runs SET started_at_ms = 1.5 WHERE run_id = 'victim'",
    "text in an integer column": "UPDATE flows_runs SET started_at_ms = 'soon' WHERE run_id = 'victim'",
    "integer above 2**53": "UPDATE flows_runs SET started_at_ms = 9007199254740992 WHERE run_id = 'victim'",
    "integer in a text column": "UPDATE flows_runs SET waiting_reason = 7 WHERE run_id = 'victim'",
    "NUL inside text": "UPDATE flows_runs SET waiting_reason = 'a' || char(0) || 'b' WHERE run_id = 'victim'",
    "astral and separator text": "UPDATE flows_runs SET waiting_reason = 'é😀' || char(8232) WHERE run_id = 'victim'",
    "blob state": "UPDATE flows_runs SET state_json = x'7b7d' WHERE run_id = 'victim'",
    "blob failure": "UPDATE flows_runs SET status = 'failed', finished_at_ms = 5, failure_json = "
                    "CAST('{\"type\": \"E\", \"message\": \"m\", \"traceback\": \"t\"}' AS BLOB) "
                    "WHERE run_id = 'victim'",
    "text that is not UTF-8": "UPDATE flows_runs SET state_json = CAST(x'7bff7d' AS TEXT) WHERE run_id = 'victim'",
    "tombstone flag a REAL just under 1": "UPDATE flows_run_changes SET deleted = 0.9999999999999999 "
                                          "WHERE run_id = 'gone'",
    "real revision": "UPDATE flows_run_changes SET revision = 1.5 WHERE run_id = 'victim'",
}


def _outcome(store: fencepost.Store) -> tuple:
    try:
        page = store.feed.changes_with_snapshots(Position(store.feed.position().source, 0))
    except fencepost.FencepostError as exc:
        return ("refused", type(exc), exc.code, exc.detail)
    except Exception as exc:  # text that is not UTF-8 fails in the driver's own decoding
        return ("failed", type(exc), str(exc))
    return ("page", page)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("case", list(_ODD_SQLITE_VALUES), ids=list(_ODD_SQLITE_VALUES))
def test_a_sqlite_page_read_as_one_json_value_answers_as_its_rows_would(store, raw, case, monkeypatch):
    """SQLite only (PostgreSQL pages are read row by row): a page comes back as one JSON value
    (``feed._page_rows``). Whatever SQLite stores, the answer (page or refusal) is the one the row
    statement gives; a REAL just under 1 as a tombstone's flag, which JSON would print as 1.0, must
    stay refused."""
    from fencepost.changefeed import feed as feed_module

    raw.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
    for run_id in ("victim", "gone", "other"):
        insert_run(raw, run_id)
    delete_run(raw, "gone")
    raw.commit()
    raw.exec_driver_sql(_ODD_SQLITE_VALUES[case])
    raw.commit()
    used = []
    page_rows = feed_module._page_rows
    monkeypatch.setattr(feed_module, "_page_rows", lambda conn, params: used.append(1) or page_rows(conn, params))
    one_value = _outcome(store)
    monkeypatch.setattr(feed_module, "_page_rows", lambda conn, params: None)
    by_rows = _outcome(store)
    assert used and one_value == by_rows


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_plain_sqlite_page_is_read_as_one_json_value(store, raw):
    """SQLite only: the rows decoded from the one JSON value are the row statement's rows."""
    from fencepost._statements import run
    from fencepost.changefeed import _sql as feed_sql
    from fencepost.changefeed import feed as feed_module

    _seed(store, 30)
    update_run(raw, "r-003", status="running", owner_host_id="h", owner_pid=7, owner_nonce="n",
               heartbeat_at_ms=4, cancel_requested_at_ms=5, waiting_reason="approval", waiting_token="t",
               waiting_request='{"ask": "é"}')
    raw.commit()
    params = {"after": 0, "watermark": store.feed.position().revision, "n": 501}

    def both(conn):
        return feed_module._page_rows(conn, params), run(conn, feed_sql.CHANGES_WITH_RUNS, params).fetchall()

    one_value, by_rows = store.db.read(both)
    assert one_value is not None and len(one_value) == 30
    assert one_value == [tuple(r) for r in by_rows]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_sqlite_page_longer_than_one_value_may_be_is_read_row_by_row(store):
    """SQLite only: a page whose JSON would pass SQLite's length limit (large states) is read by
    the row statement instead, in the same snapshot, and answers the same."""
    import sqlite3

    from fencepost.changefeed import feed as feed_module

    _seed(store, 40)
    params = {"after": 0, "watermark": store.feed.position().revision, "n": 501}

    def limited(conn):
        driver = conn.connection.driver_connection
        before = driver.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 2000)
        try:
            return feed_module._page_rows(conn, params)
        finally:
            driver.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, before)

    assert store.db.read(limited) is None
    assert store.db.read(lambda conn: feed_module._page_rows(conn, params)) is not None
