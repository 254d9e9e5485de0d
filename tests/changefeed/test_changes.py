"""changes_since and position: the coalesced state feed (REFERENCE 4, UPSTREAM-TESTS C1 ES-04..06)."""

from __future__ import annotations

import re

import pytest

import fencepost
from fencepost import Change, Position, SourceChanged
from tests.changefeed.conftest import change_table, delete_run, insert_run, page_all, restore_older_copy, update_run


def test_fresh_store_is_at_revision_zero_of_a_hex_source(store):
    position = store.feed.position()
    assert re.fullmatch(r"[0-9a-f]{32}", position.source)
    assert position.revision == 0
    batch = store.feed.changes_since(position, 1)
    assert batch.changes == [] and not batch.has_more and batch.next_revision == 0


def test_feed_pages_in_revision_order_with_tombstones(store, raw, origin):
    """ES-04: insert a, b, c; complete a; delete b; limit 1 then 2 visits c, a (live), b (deleted)."""
    for rid in ("a", "b", "c"):
        insert_run(raw, rid)
    raw.commit()
    before = store.feed.read(["a"]).snapshots[0]
    update_run(raw, "a", status="completed", finished_at_ms=5)
    raw.commit()
    after = store.feed.read(["a"]).snapshots[0]
    assert fencepost.is_newer(after, before) and not fencepost.is_newer(before, after)
    delete_run(raw, "b")
    raw.commit()
    source = origin.source

    first = store.feed.changes_since(origin, 1)
    assert first.changes == [Change("c", source, 3, False)]
    assert first.has_more and first.next_revision == 3 and first.revision == 5
    second = store.feed.changes_since(first.next_position, 2)
    assert second.changes == [Change("a", source, 4, False), Change("b", source, 5, True)]
    assert not second.has_more and second.next_revision == second.revision == 5


def test_limit_outside_1_to_1000_is_decode_failed(store, raw, origin):
    """ES-05: limits 0, 1 001, 1.5, True refused; 999 and 1 000 accepted."""
    for rid in ("a", "b", "c"):
        insert_run(raw, rid)
    raw.commit()
    for bad in (0, 1001, -1, 1.5, True, None):
        with pytest.raises(fencepost.RunStoreError) as err:
            store.feed.changes_since(origin, bad)
        assert err.value.code == "decode_failed"
        assert not isinstance(err.value, SourceChanged)
    assert len(store.feed.changes_since(origin, 999).changes) == 3
    assert len(store.feed.changes_since(origin, 1000).changes) == 3


def test_position_from_another_source_is_refused(store, raw, origin):
    """ES-05: another source -> SourceChanged (invalid_run), never compared by revision."""
    insert_run(raw, "a")
    raw.commit()
    other = Position("0" * 32 if origin.source != "0" * 32 else "1" * 32, 0)
    with pytest.raises(SourceChanged) as err:
        store.feed.changes_since(other)
    assert err.value.code == "invalid_run"
    assert isinstance(err.value, fencepost.RunStoreError)


def test_position_ahead_of_the_watermark_is_refused(store, raw, origin):
    """ES-05 (revision 999 ahead) and the restored-copy case: same source, revision behind the consumer."""
    insert_run(raw, "a")
    raw.commit()
    with pytest.raises(SourceChanged) as err:
        store.feed.changes_since(Position(origin.source, 999))
    assert err.value.code == "invalid_run"
    assert store.feed.changes_since(Position(origin.source, 1)).changes == []


def test_malformed_position_is_decode_failed(store, origin):
    for bad in (None, ("a" * 32, 0), Position("A" * 32, 0), Position("abc", 0), Position(origin.source, -1),
                Position(origin.source, 2**53), Position(origin.source, True)):
        with pytest.raises(fencepost.RunStoreError) as err:
            store.feed.changes_since(bad)  # type: ignore[arg-type]
        assert err.value.code == "decode_failed"


def test_mutations_coalesce_to_the_latest_revision_per_run(store, raw, origin):
    insert_run(raw, "a")
    raw.commit()
    for i in range(5):
        update_run(raw, "a", state_json=f'{{"n": {i}}}')
        raw.commit()
    changes = page_all(store.feed, origin)
    assert changes == [Change("a", origin.source, 6, False)]
    assert store.feed.position().revision == 6


def test_tombstones_are_kept_and_recreation_replaces_them_with_a_higher_revision(store, raw, origin):
    insert_run(raw, "a")
    insert_run(raw, "b")
    raw.commit()
    delete_run(raw, "a")
    raw.commit()
    assert page_all(store.feed, origin)[-1] == Change("a", origin.source, 3, True)
    # Many later writes never remove the tombstone.
    for i in range(20):
        update_run(raw, "b", state_json=f'{{"n": {i}}}')
        raw.commit()
    assert Change("a", origin.source, 3, True) in page_all(store.feed, origin)
    insert_run(raw, "a", created=7)
    raw.commit()
    changes = page_all(store.feed, origin)
    assert [c for c in changes if c.run_id == "a"] == [Change("a", origin.source, 24, False)]
    assert store.feed.read(["a"]).snapshots[0].revision == 24


def test_reopened_store_keeps_source_and_tombstones(db_url, clock, raw, store, origin):
    """ES-06: after reopening, a deleted run reads as Missing(deleted) and the feed lists it deleted."""
    insert_run(raw, "a", created=1, finished_at_ms=1, status="completed")
    insert_run(raw, "b", created=2)
    insert_run(raw, "c", created=3)
    raw.commit()
    delete_run(raw, "b")
    raw.commit()
    with fencepost.open(db_url, clock=clock) as again:
        assert again.feed.position() == Position(origin.source, 4)
        assert again.feed.read(["b"]).snapshots == [fencepost.Missing("b", origin.source, 4, True)]
        delete_run(raw, "a")  # a retention pass deleting finished runs, by raw SQL
        raw.commit()
        changes = again.feed.changes_since(origin, 10).changes
        assert [(c.run_id, c.deleted) for c in changes] == [("c", False), ("b", True), ("a", True)]


def test_rolled_back_writes_leave_no_change(store, raw, origin):
    insert_run(raw, "kept")
    raw.commit()
    insert_run(raw, "ghost")
    update_run(raw, "kept", status="completed")
    raw.rollback()

    def failing(conn):
        insert_run(conn, "ghost2")
        raise fencepost.RunStoreError("invalid_run", "test", "forced rollback")

    with pytest.raises(fencepost.RunStoreError):
        store.db.write(failing)
    assert page_all(store.feed, origin) == [Change("kept", origin.source, 1, False)]
    assert store.feed.position().revision == 1
    insert_run(raw, "next")
    raw.commit()
    assert store.feed.position().revision == 2  # the rolled-back bumps did not consume revisions


def test_raw_sql_writes_of_every_kind_are_tracked(store, raw, origin):
    insert_run(raw, "a")
    insert_run(raw, "b")
    raw.commit()
    raw.exec_driver_sql("UPDATE flows_runs SET status = 'suspended'")  # one statement, two rows
    raw.commit()
    raw.exec_driver_sql("DELETE FROM flows_runs WHERE run_id = 'a'")
    raw.commit()
    changes = page_all(store.feed, origin)
    # The two rows of one UPDATE statement take revisions 3 and 4 in the engine's row order.
    assert [(c.run_id, c.deleted) for c in changes] == [("b", False), ("a", True)]
    assert changes[0].revision in (3, 4) and changes[1].revision == 5
    assert [(c.run_id, c.revision, c.deleted) for c in changes] == change_table(raw)


def test_paging_visits_each_change_once_in_revision_order(store, raw, origin):
    for i in range(60):
        insert_run(raw, f"r{i:03d}", created=i)
    raw.commit()
    for i in range(0, 60, 3):
        update_run(raw, f"r{i:03d}", status="completed")
    for i in range(1, 60, 7):
        delete_run(raw, f"r{i:03d}")
    raw.commit()
    for limit in (1, 7, 50, 1000):
        changes = page_all(store.feed, origin, limit)
        revisions = [c.revision for c in changes]
        assert revisions == sorted(set(revisions))
        assert len({c.run_id for c in changes}) == len(changes) == 60
        assert [(c.run_id, c.revision, c.deleted) for c in changes] == change_table(raw)


def test_a_call_inside_a_write_sees_that_writes_rows(store, origin):
    def body(conn):
        insert_run(conn, "inside")
        return store.feed.changes_since(origin).changes

    assert [c.run_id for c in store.db.write(body)] == ["inside"]


def test_a_restored_older_copy_is_refused_until_the_host_rotates_the_source(store, raw, origin, backend, tmp_path):
    """PITFALLS 'restores rewind the source': a consumer ahead of the restored copy gets SourceChanged
    (never a silent comparison); after rotate_source it rebuilds from the new source's revision 0."""
    insert_run(raw, "a")
    insert_run(raw, "b")
    raw.commit()

    def write_more():
        for i in range(3):
            insert_run(raw, f"later-{i}")
        raw.commit()

    consumer = None

    def consume():
        nonlocal consumer
        write_more()
        consumer = store.feed.position()

    restore_older_copy(store, raw, backend, tmp_path, consume)
    assert consumer.revision == 5 and store.feed.position() == Position(origin.source, 2)
    with pytest.raises(SourceChanged):
        store.feed.changes_since(consumer)
    rotated = store.feed.rotate_source()
    assert rotated.source != origin.source and rotated.revision == 2
    with pytest.raises(SourceChanged):
        store.feed.changes_since(consumer)
    rebuilt = page_all(store.feed, Position(rotated.source, 0))
    assert [(c.run_id, c.source) for c in rebuilt] == [("a", rotated.source), ("b", rotated.source)]


@pytest.mark.parametrize(("wrong", "field"), [
    (None, "stored"),
    ({"source": "s", "revision": 1}, "stored"),
    ("pos", "stored"),
    ("revision-str", "stored.revision"),
    ("revision-nan", "stored.revision"),
    ("revision-negative", "stored.revision"),
    ("source-int", "stored.source"),
])
def test_is_newer_refuses_what_is_not_a_position_naming_the_argument(store, wrong, field):
    """The docs tell a consumer to apply an update only if ``is_newer(incoming, stored)``. With a
    stored value that was not a position (``None`` for a run never seen, a dict read back from the
    consumer's own table) it raised ``AttributeError: 'NoneType' object has no attribute 'source'``;
    a revision read back as text raised ``TypeError: '>' not supported``; a NaN revision silently
    answered False. Each is now ``ValueError`` naming the argument. Both backends (real positions)."""
    store.runs.create("a", "{}")
    incoming = store.feed.read(["a"]).snapshots[0]
    stored = {
        "revision-str": Position(incoming.source, "0"),
        "revision-nan": Position(incoming.source, float("nan")),
        "revision-negative": Position(incoming.source, -1),
        "source-int": Position(5, 0),
    }.get(wrong, wrong) if isinstance(wrong, str) else wrong
    with pytest.raises(ValueError) as caught:
        fencepost.is_newer(incoming, stored)
    assert str(caught.value).startswith(f"is_newer: {field} ")
    with pytest.raises(ValueError, match=r"^is_newer: incoming"):
        fencepost.is_newer(stored, incoming)
    assert fencepost.is_newer(incoming, Position(incoming.source, 0))


def test_every_committed_row_write_takes_one_revision_and_a_raw_delete_is_tracked(db_url, clock, raw, store, origin):
    """ER-04: a and b created (revisions 1, 2); a is owned (3), cancel requested (4), acknowledged at
    4 (5) and again at 5 (6: the row matched, though the first record is kept), cancelled (7); calls
    that match no row take none. Another connection deletes a with raw SQL (8). Reopened: the same
    source at 8, and the feed is [b 2 live, a 8 deleted]."""
    from fencepost import OwnerId, RunSnapshot

    owner = OwnerId("host-a", 101, "owner-a")
    runs = store.runs
    runs.create("a", "{}")
    runs.create("b", "{}")
    assert runs.acknowledge_cancel("a", owner, 2) is False
    runs.claim_and_own("a", RunSnapshot("pending", None, None), owner, 2)
    assert runs.acknowledge_cancel("a", owner, 3) is False
    runs.request_cancel("a", 3)
    assert runs.acknowledge_cancel("a", OwnerId("host-a", 101, "stale"), 4) is False
    assert runs.acknowledge_cancel("a", owner, 4) is True
    assert runs.acknowledge_cancel("a", owner, 5) is True
    runs.transition_owned("a", owner, "cancelled")
    assert runs.acknowledge_cancel("a", owner, 6) is False
    assert store.feed.position() == Position(origin.source, 7)
    delete_run(raw, "a")
    raw.commit()
    with fencepost.open(db_url, clock=clock) as again:
        assert again.feed.position() == Position(origin.source, 8)
        assert again.feed.changes_since(origin, 10).changes == [
            Change("b", origin.source, 2, False), Change("a", origin.source, 8, True)]
