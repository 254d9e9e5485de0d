"""Keyset listing (UPSTREAM-TESTS C4 RL-01..05, C3 EC-02/EC-03)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math

import msgspec
import pytest

import fencepost
from fencepost import SourceChanged
from tests.changefeed.conftest import delete_run, insert_run, update_run

STATUSES = ["pending", "running", "suspended", "completed", "failed", "cancelled"]
REASONS = [None, "timer", "event", "approval", "quota", "human", "custom"]


def _model_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        status = STATUSES[i % 6]
        row = {
            "run_id": f"r{i:05d}",
            "created": i // 4,
            "status": status,
            "state": json.dumps({"flowName": f"flow{(i // 5) % 3}"}),
            "parent_run_id": None if i % 4 == 0 else "r00000",
            "lineage_id": f"r0000{i % 5}",
            "round_ordinal": i // 5,
            "waiting_reason": REASONS[(i // 15) % 7],
        }
        if status == "running":
            row.update(owner_host_id="h", owner_pid=1, owner_nonce="n", heartbeat_at_ms=0)
        rows.append(row)
    return rows


def _insert_model(conn, rows):
    for row in rows:
        extra = {k: v for k, v in row.items() if k not in ("run_id", "created", "status", "state")}
        insert_run(conn, row["run_id"], created=row["created"], status=row["status"], state=row["state"], **extra)
    conn.commit()


def _matches(row: dict, f: dict) -> bool:
    for key, value in f.items():
        if key == "status" and row["status"] != value:
            return False
        if key == "flow_name" and json.loads(row["state"]).get("flowName") != value:
            return False
        if key == "parent_run_id" and row["parent_run_id"] != value:
            return False
        if key == "lineage_id" and (row["lineage_id"] or row["run_id"]) != value:
            return False
        if key == "waiting_reason" and row["waiting_reason"] != value:
            return False
        if key == "created_after_ms" and row["created"] < value:
            return False
        if key == "created_before_ms" and row["created"] > value:
            return False
    return True


def _list_all(feed, filters, limit):
    ids, pages, cursor = [], 0, None
    while True:
        page = feed.list_runs(filters, cursor, limit)
        pages += 1
        ids.extend(r.run_id for r in page.runs)
        cursor = page.cursor
        if cursor is None:
            return ids, pages


def _filter_sets():
    base = {"status": "suspended", "flow_name": "flow1", "parent_run_id": "r00000", "lineage_id": "r00000",
            "waiting_reason": "timer"}
    for size in range(len(base) + 1):
        for keys in itertools.combinations(base, size):
            subset = {k: base[k] for k in keys}
            yield subset
            yield {**subset, "created_after_ms": 3, "created_before_ms": 7}
    for status in STATUSES:
        yield {"status": status}
    for reason in REASONS:
        yield {"waiting_reason": reason}
    for k in range(5):
        yield {"lineage_id": f"r0000{k}"}
    yield {"parent_run_id": None}
    yield {"lineage_id": "absent"}
    yield {"flow_name": "absent"}
    yield {"created_after_ms": 3}
    yield {"created_before_ms": 7}
    yield {"created_after_ms": 10, "created_before_ms": 3}


def test_every_filter_subset_pages_exactly_the_model(store, raw):
    """RL-01 (100 runs): every filter subset, limits 7 and 23, cursors followed: the model, in key order."""
    rows = _model_rows(100)
    _insert_model(raw, rows)
    with fencepost.open(store.url, clock=store.clock) as reopened:
        for f in _filter_sets():
            expected = [r["run_id"] for r in sorted(rows, key=lambda r: (r["created"], r["run_id"])) if _matches(r, f)]
            for limit in (7, 23):
                ids, pages = _list_all(reopened.feed, f, limit)
                assert ids == expected, f
                assert pages == max(1, math.ceil(len(expected) / limit))


def test_the_32_filter_subsets_with_flow0_page_exactly_the_model(db_url, clock, raw):
    """RL-06: a database given to the store (filled by another connection first), 100 runs, the 32
    subsets of {status suspended, flow0, parent r00000, lineage r00000, reason timer}, limit 7:
    each listing equals the model."""
    rows = _model_rows(100)
    _insert_model(raw, rows)
    base = {"status": "suspended", "flow_name": "flow0", "parent_run_id": "r00000", "lineage_id": "r00000",
            "waiting_reason": "timer"}
    subsets = [{k: base[k] for k in keys} for size in range(6) for keys in itertools.combinations(base, size)]
    assert len(subsets) == 32
    ordered = sorted(rows, key=lambda r: (r["created"], r["run_id"]))
    with fencepost.open(db_url, clock=clock) as given:
        for f in subsets:
            assert _list_all(given.feed, f, 7)[0] == [r["run_id"] for r in ordered if _matches(r, f)], f


def test_unfiltered_listing_of_1000_runs_pages_in_key_order(store, raw):
    """RL-01 (1 000 runs, no filter and one status filter)."""
    rows = _model_rows(1000)
    _insert_model(raw, rows)
    ordered = sorted(rows, key=lambda r: (r["created"], r["run_id"]))
    assert _list_all(store.feed, None, 200)[0] == [r["run_id"] for r in ordered]
    failed = [r["run_id"] for r in ordered if r["status"] == "failed"]
    assert _list_all(store.feed, {"status": "failed"}, 23)[0] == failed


def test_live_pages_admit_later_keys_and_never_revisit_earlier_ones(store, raw):
    """RL-02: page [a,c]; a peer inserts b, d, deletes e, completes a and g; next page is [d]."""
    for i, rid in enumerate("aceg"):
        insert_run(raw, rid, created=i * 2)
    raw.commit()
    filters = {"status": "pending"}
    first = store.feed.list_runs(filters, None, 2)
    assert [r.run_id for r in first.runs] == ["a", "c"] and first.cursor
    insert_run(raw, "b", created=1)
    insert_run(raw, "d", created=5)
    delete_run(raw, "e")
    update_run(raw, "a", status="completed")
    update_run(raw, "g", status="completed")
    raw.commit()
    second = store.feed.list_runs(filters, first.cursor, 2)
    assert [r.run_id for r in second.runs] == ["d"] and second.cursor is None
    assert second.revision > first.revision
    assert [r.run_id for r in store.feed.list_runs(filters, first.cursor, 1).runs] == ["d"]
    for padded in (first.cursor.ljust(65_535), first.cursor.ljust(65_536)):
        assert [r.run_id for r in store.feed.list_runs(filters, padded, 2).runs] == ["d"]
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.list_runs(filters, first.cursor.ljust(65_537), 2)
    # An over-long cursor is a bad cursor, not a bad option (issue 11).
    assert err.value.code == "invalid_cursor" and "65536 characters" in str(err.value)


def test_cursor_is_bound_to_filters_and_source(store, raw, make_db_url, clock):
    """RL-03: filter key order is irrelevant; other filters -> invalid_cursor; garbage -> invalid_cursor;
    the cursor on another database -> SourceChanged."""
    for i, rid in enumerate("abc"):
        insert_run(raw, rid, created=i, state='{"flowName": "test"}')
    raw.commit()
    page = store.feed.list_runs({"status": "pending", "flow_name": "test"}, None, 1)
    swapped = store.feed.list_runs({"flow_name": "test", "status": "pending"}, page.cursor, 1)
    assert [r.run_id for r in swapped.runs] == ["b"]
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.list_runs({"status": "pending"}, page.cursor, 1)
    assert err.value.code == "invalid_cursor"
    version2 = json.loads(page.cursor)
    version2["version"] = 2
    for garbage in ("1", "broken", "{}", json.dumps(version2), "", "[]"):
        with pytest.raises(fencepost.RunStoreError) as err:
            store.feed.list_runs({"status": "pending", "flow_name": "test"}, garbage, 1)
        assert err.value.code == "invalid_cursor"
    with fencepost.open(make_db_url(), clock=clock) as other:
        with pytest.raises(SourceChanged):
            other.feed.list_runs({"status": "pending", "flow_name": "test"}, page.cursor, 1)
    store.feed.rotate_source()
    with pytest.raises(SourceChanged):
        store.feed.list_runs({"status": "pending", "flow_name": "test"}, page.cursor, 1)


def test_listing_options_are_checked(store, raw):
    """RL-04: limits 199/200 fine; 0, 201, 1.5, a numeric cursor, an offset option, an unknown filter refused."""
    for i, rid in enumerate("abcdg"):
        insert_run(raw, rid, created=i)
    raw.commit()
    assert [r.run_id for r in store.feed.list_runs().runs] == list("abcdg")
    assert len(store.feed.list_runs(limit=199).runs) == len(store.feed.list_runs(limit=200).runs) == 5
    bad_calls = [
        {"limit": 0}, {"limit": 201}, {"limit": 1.5}, {"limit": True}, {"cursor": 5},
        {"filters": {"offset": 10}}, {"filters": {"colour": "red"}}, {"filters": {"status": "nope"}},
        {"filters": {"created_after_ms": -1}}, {"filters": {"status": 3}}, {"filters": ["status"]},
    ]
    for kwargs in bad_calls:
        with pytest.raises(fencepost.RunStoreError) as err:
            store.feed.list_runs(**kwargs)
        assert err.value.code == "invalid_options", kwargs


def test_corrupt_row_on_a_page_is_list_failed(store, raw, backend):
    """RL-05: a row that fails decoding fails the page as list_failed naming decode_failed; later calls work."""
    insert_run(raw, "a")
    insert_run(raw, "b", created=1)
    raw.commit()
    raw.exec_driver_sql("UPDATE flows_run_changes SET deleted = 1 WHERE run_id = 'b'")
    raw.commit()
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.list_runs()
    assert err.value.code == "list_failed" and "decode_failed" in str(err.value)
    assert [r.run_id for r in store.feed.list_runs(limit=1).runs] == ["a"]


def test_long_values_make_long_cursors_that_still_work(store, raw):
    """EC-03: id, parent, lineage, flow and reason of 1 024 control characters make a very long cursor that works."""
    ctrl = "".join(chr(1 + (i % 31)) for i in range(1024))
    parent = "\x02" * 1024
    insert_run(raw, parent)
    first_id, second_id = "\x01" * 1023 + "a", "\x01" * 1023 + "b"
    for rid in (first_id, second_id):
        insert_run(raw, rid, created=1, parent_run_id=parent, lineage_id=ctrl, round_ordinal=ord(rid[-1]),
                   state=json.dumps({"flowName": ctrl}), status="suspended", waiting_reason=ctrl)
    raw.commit()
    filters = {"parent_run_id": parent, "lineage_id": ctrl, "flow_name": ctrl, "waiting_reason": ctrl}
    page = store.feed.list_runs(filters, None, 1)
    assert [r.run_id for r in page.runs] == [first_id]
    assert 25_000 < len(page.cursor) <= 65_536  # escaped control characters: about 6 chars each
    nxt = store.feed.list_runs(filters, page.cursor, 1)
    assert [r.run_id for r in nxt.runs] == [second_id] and nxt.cursor is None


def test_listing_shows_waiting_digest_never_the_token(store, raw):
    """EC-02 (listing half): the raw token appears nowhere in a listed page."""
    token = "token" * 500
    insert_run(raw, "parked", status="suspended", waiting_reason="reason" * 300, waiting_token=token)
    raw.commit()
    page = store.feed.list_runs({"waiting_reason": "reason" * 300})
    assert page.runs[0].waiting.token_digest == hashlib.sha256(token.encode()).hexdigest()
    assert page.runs[0].waiting.kind == "other"
    assert token.encode() not in msgspec.json.encode(page)


def test_each_page_is_coherent_at_its_revision(store, raw):
    insert_run(raw, "a")
    raw.commit()
    update_run(raw, "a", status="completed")
    raw.commit()
    page = store.feed.list_runs()
    assert page.revision == 2 and page.runs[0].revision == 2 and page.runs[0].status == "completed"
    assert page.source == store.feed.position().source


def _list_all_newest_first(feed, filters, limit):
    ids, cursor = [], None
    while True:
        page = feed.list_runs(filters, cursor, limit, newest_first=True)
        ids.extend(r.run_id for r in page.runs)
        cursor = page.cursor
        if cursor is None:
            return ids


def test_newest_first_pages_the_same_key_backwards(store, raw):
    """The listing walked newest first: every filter set, limits 7 and 23, is the model reversed."""
    rows = _model_rows(100)
    _insert_model(raw, rows)
    ordered = sorted(rows, key=lambda r: (r["created"], r["run_id"]), reverse=True)
    for f in [None, {"status": "failed"}, {"flow_name": "flow1", "created_after_ms": 3, "created_before_ms": 20},
              {"parent_run_id": None}, {"lineage_id": "absent"}]:
        expected = [r["run_id"] for r in ordered if _matches(r, f or {})]
        for limit in (7, 23):
            assert _list_all_newest_first(store.feed, f, limit) == expected, f


def test_a_cursor_resumes_only_the_order_it_was_issued_for(store, raw):
    """A newest-first cursor is invalid_cursor for the ascending listing and the other way round."""
    for i, rid in enumerate("abcd"):
        insert_run(raw, rid, created=i)
    raw.commit()
    newest = store.feed.list_runs(None, None, 2, newest_first=True)
    assert [r.run_id for r in newest.runs] == ["d", "c"]
    oldest = store.feed.list_runs(None, None, 2)
    assert [r.run_id for r in oldest.runs] == ["a", "b"]
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.list_runs(None, newest.cursor, 2)
    assert err.value.code == "invalid_cursor"
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.list_runs(None, oldest.cursor, 2, newest_first=True)
    assert err.value.code == "invalid_cursor"
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.list_runs(None, None, 2, newest_first="yes")
    assert err.value.code == "invalid_options"
    assert [r.run_id for r in store.feed.list_runs(None, newest.cursor, 2, newest_first=True).runs] == ["b", "a"]
