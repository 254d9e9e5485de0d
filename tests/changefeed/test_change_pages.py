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
