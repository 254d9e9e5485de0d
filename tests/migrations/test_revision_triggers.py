"""Revision triggers on ``flows_runs``, driven with raw SQL on both backends (REFERENCE 1.5, RV-*)."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

import fencepost

INSERT = text(
    "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES (:id, 'pending', '{}', :t)"
)


def _source(raw) -> tuple[str, int]:
    s, r = raw.exec_driver_sql("SELECT source, revision FROM flows_run_source").one()
    return s, int(r)


def _changes(raw) -> dict[str, tuple[int, int]]:
    rows = raw.exec_driver_sql("SELECT run_id, revision, deleted FROM flows_run_changes").all()
    return {r[0]: (int(r[1]), int(r[2])) for r in rows}


def test_insert_update_delete_each_advance_the_revision(store: fencepost.Store, raw) -> None:
    raw.execute(INSERT, {"id": "a", "t": 1})
    raw.commit()
    assert _source(raw)[1] == 1 and _changes(raw) == {"a": (1, 0)}
    raw.exec_driver_sql("UPDATE flows_runs SET state_json = '[1]' WHERE run_id = 'a'")
    raw.commit()
    assert _source(raw)[1] == 2 and _changes(raw) == {"a": (2, 0)}
    raw.exec_driver_sql("DELETE FROM flows_runs WHERE run_id = 'a'")
    raw.commit()
    assert _source(raw)[1] == 3 and _changes(raw) == {"a": (3, 1)}


def test_noop_update_still_consumes_a_revision(store: fencepost.Store, raw) -> None:
    raw.execute(INSERT, {"id": "a", "t": 1})
    raw.exec_driver_sql("UPDATE flows_runs SET status = status WHERE run_id = 'a'")
    raw.commit()
    assert _changes(raw) == {"a": (2, 0)}


def test_deleted_id_keeps_tombstone_and_recreation_gets_higher_revision(store: fencepost.Store, raw) -> None:
    raw.execute(INSERT, {"id": "a", "t": 1})
    raw.execute(INSERT, {"id": "b", "t": 1})
    raw.exec_driver_sql("DELETE FROM flows_runs WHERE run_id = 'a'")
    raw.commit()
    assert _changes(raw)["a"] == (3, 1)
    raw.execute(INSERT, {"id": "a", "t": 2})
    raw.commit()
    assert _changes(raw) == {"a": (4, 0), "b": (2, 0)}


def test_deleting_the_newest_change_row_never_lets_a_revision_be_reused(store: fencepost.Store, raw) -> None:
    """Revisions come from the source counter, not from the largest revision still stored (as a
    rowid would): after the newest change row is deleted (a pruned tombstone), the next write gets
    a revision above every one handed out, so a reader past the deleted one still sees it."""
    raw.execute(INSERT, {"id": "a", "t": 1})
    raw.execute(INSERT, {"id": "b", "t": 1})
    raw.exec_driver_sql("DELETE FROM flows_runs WHERE run_id = 'b'")
    raw.commit()
    assert _changes(raw) == {"a": (1, 0), "b": (3, 1)}
    raw.exec_driver_sql("DELETE FROM flows_run_changes WHERE run_id = 'b'")
    raw.commit()
    source, _ = _source(raw)
    raw.execute(INSERT, {"id": "c", "t": 2})
    raw.commit()
    assert _changes(raw) == {"a": (1, 0), "c": (4, 0)}
    page = store.feed.changes_since(fencepost.Position(source, 3), 10)
    assert [change.run_id for change in page.changes] == ["c"]


def test_rolled_back_mutation_leaves_no_revision_and_no_change(store: fencepost.Store, raw) -> None:
    raw.execute(INSERT, {"id": "a", "t": 1})
    raw.commit()
    raw.execute(INSERT, {"id": "b", "t": 1})
    raw.exec_driver_sql("UPDATE flows_runs SET state_json = '[2]' WHERE run_id = 'a'")
    raw.rollback()
    assert _source(raw)[1] == 1 and _changes(raw) == {"a": (1, 0)}


def test_revision_overflow_refuses_the_mutation(store: fencepost.Store, raw) -> None:
    """ER-05: at revision 2^53-1 a create (store or raw SQL) fails; no row; an earlier tombstone is intact."""
    raw.execute(INSERT, {"id": "a", "t": 1})
    raw.exec_driver_sql("DELETE FROM flows_runs WHERE run_id = 'a'")
    raw.exec_driver_sql("UPDATE flows_run_source SET revision = 9007199254740991")
    raw.commit()
    with pytest.raises(fencepost.RunStoreError):
        store.runs.create("overflow", "{}")
    with pytest.raises(DBAPIError):
        raw.execute(INSERT, {"id": "overflow", "t": 1})
    raw.rollback()
    assert raw.exec_driver_sql("SELECT count(*) FROM flows_runs").scalar() == 0
    assert _source(raw)[1] == 9007199254740991 and _changes(raw) == {"a": (2, 1)}


def test_missing_source_row_makes_every_mutation_fail(store: fencepost.Store, raw) -> None:
    """ER-06: with the source row gone, a store create and raw INSERT, UPDATE and DELETE all fail."""
    raw.execute(INSERT, {"id": "a", "t": 1})
    raw.exec_driver_sql("DELETE FROM flows_run_source")
    raw.commit()
    with pytest.raises(fencepost.RunStoreError):
        store.runs.create("c", "{}")
    for stmt in (
        "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES ('b', 'pending', '{}', 1)",
        "UPDATE flows_runs SET state_json = '[1]' WHERE run_id = 'a'",
        "DELETE FROM flows_runs WHERE run_id = 'a'",
    ):
        with pytest.raises(DBAPIError):
            raw.exec_driver_sql(stmt)
        raw.rollback()
    assert raw.exec_driver_sql("SELECT run_id, state_json FROM flows_runs").all() == [("a", "{}")]


def test_run_id_is_immutable(store: fencepost.Store, raw) -> None:
    """ER-03: a raw UPDATE renaming a run is refused; the run and ``flows_run_source`` are unchanged."""
    raw.execute(INSERT, {"id": "a", "t": 1})
    raw.commit()
    before = _source(raw)
    with pytest.raises(DBAPIError):
        raw.exec_driver_sql("UPDATE flows_runs SET run_id = 'z' WHERE run_id = 'a'")
    raw.rollback()
    assert raw.exec_driver_sql("SELECT run_id FROM flows_runs").scalar() == "a"
    assert _source(raw) == before and _changes(raw) == {"a": (1, 0)}


def test_created_at_is_immutable(store: fencepost.Store, raw) -> None:
    raw.execute(INSERT, {"id": "a", "t": 1})
    raw.commit()
    with pytest.raises(DBAPIError):
        raw.exec_driver_sql("UPDATE flows_runs SET created_at_ms = 5 WHERE run_id = 'a'")
    raw.rollback()


@pytest.mark.parametrize(
    "stmt",
    [
        "UPDATE flows_runs SET status = 'running' WHERE run_id = 'a'",
        "UPDATE flows_runs SET heartbeat_at_ms = 5 WHERE run_id = 'a'",
        "UPDATE flows_runs SET claim_host_id = 'h' WHERE run_id = 'a'",
        "UPDATE flows_runs SET state_json = 'not-json' WHERE run_id = 'a'",
        "UPDATE flows_runs SET started_at_ms = -1 WHERE run_id = 'a'",
        "UPDATE flows_runs SET finished_at_ms = 9007199254740992 WHERE run_id = 'a'",
        "UPDATE flows_runs SET status = 'unknown' WHERE run_id = 'a'",
        "UPDATE flows_runs SET lineage_id = 'l' WHERE run_id = 'a'",
        "UPDATE flows_runs SET waiting_token = 't' WHERE run_id = 'a'",
    ],
    ids=["running-without-owner", "heartbeat-on-pending", "partial-claim", "invalid-json",
         "negative-time", "unsafe-integer", "unknown-status", "lineage-without-round", "wait-without-reason"],
)
def test_row_invariants_are_database_checks(store: fencepost.Store, raw, stmt: str) -> None:
    raw.execute(INSERT, {"id": "a", "t": 1})
    raw.commit()
    with pytest.raises(DBAPIError):
        raw.exec_driver_sql(stmt)
    raw.rollback()
    assert _source(raw)[1] == 1
