"""Statements the run store and the change feed send on the driver cursor (compiled once, past
SQLAlchemy's execution machinery) are still reported to ``before_cursor_execute`` and
``after_cursor_execute`` listeners, as SQLAlchemy's own statements are: tracing and statement
counting see every statement of a write."""

from __future__ import annotations

from sqlalchemy import event


def test_listeners_see_run_store_and_feed_statements_and_stop_seeing_them_once_removed(store):
    before: list[str] = []
    after: list[str] = []

    def on_before(_conn, _cursor, statement, parameters, _context, _many):
        before.append(statement)
        return statement, parameters

    def on_after(_conn, _cursor, statement, *_rest):
        after.append(statement)

    event.listen(store.db.engine, "before_cursor_execute", on_before, retval=True)
    event.listen(store.db.engine, "after_cursor_execute", on_after)
    try:
        store.runs.create("r1", "{}")
        assert store.runs.get("r1").run_id == "r1"
        page = store.feed.changes_since(store.feed.position().__class__(store.feed.position().source, 0))
    finally:
        event.remove(store.db.engine, "before_cursor_execute", on_before)
        event.remove(store.db.engine, "after_cursor_execute", on_after)
    assert [c.run_id for c in page.changes] == ["r1"]
    assert any(s.lstrip().upper().startswith("INSERT INTO FLOWS_RUNS") for s in before)
    assert any("FROM flows_run_changes" in s for s in before)
    assert before == after
    seen = len(before)
    store.runs.create("r2", "{}")
    assert len(before) == seen  # removed listeners see nothing more
