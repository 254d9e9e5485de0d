"""Statements the run store, the journal and the change feed send on the driver cursor (compiled once, past
SQLAlchemy's execution machinery) are still reported to ``before_cursor_execute`` and
``after_cursor_execute`` listeners, as SQLAlchemy's own statements are: tracing and statement
counting see every statement of a write."""

from __future__ import annotations

from sqlalchemy import event

from fencepost.journal import NewEntry


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


def test_listeners_see_journal_appends_single_and_batched(store):
    """The journal's head lookup and inserts (one row, and several rows in one driver call)."""
    seen: list[tuple[str, bool]] = []

    def on_before(_conn, _cursor, statement, parameters, _context, many):
        seen.append((statement, many))
        return statement, parameters

    event.listen(store.db.engine, "before_cursor_execute", on_before, retval=True)
    try:
        store.journal.append_unfenced("r1", "step.finished", {"n": 1}, source_id="w")
        store.journal.append_many_unfenced(
            "r1", [NewEntry("step.finished", {"n": 2}), NewEntry("step.finished", {"n": 3})], source_id="w")
    finally:
        event.remove(store.db.engine, "before_cursor_execute", on_before)
    inserts = [many for statement, many in seen if statement.lstrip().upper().startswith("INSERT INTO FLOWS_JOURNAL")]
    assert inserts == [False, True]
    assert sum("FROM flows_journal_events" in statement for statement, _ in seen) >= 2
    assert [e.payload for e in store.journal.entries("r1").entries] == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_a_statements_integer_constants_are_sent_in_its_text_and_still_give_the_same_rows(store):
    """Integer constants a statement carries as anonymous parameters (the head lookup's ``LIMIT 1``s,
    the ``OFFSET 0`` SQLite's compiler adds) are written into its text once, not merged into the
    parameters of every execution; twelve of them check that ``param_1`` does not rewrite ``param_10``.
    The journal's insert, bound by position on SQLite, stores every column where it belongs."""
    from sqlalchemy import literal, select

    from fencepost._statements import Sql, run
    from fencepost.journal._sql import HEADS

    text_, defaults = HEADS.compiled(store.db.name)
    assert defaults == {} and "LIMIT 1" in text_
    constants = Sql(select(*[literal(i * 7) for i in range(12)]))
    assert constants.compiled(store.db.name)[1] == {}
    assert tuple(store.db.read(lambda conn: run(conn, constants, {}).fetchone())) == tuple(i * 7 for i in range(12))

    store.journal.append_unfenced("r1", "step.finished", {"n": 1}, source_id="w", meta={"m": 2})
    (entry,) = store.journal.entries("r1").entries
    assert (entry.run_id, entry.seq, entry.source_id, entry.source_seq, entry.event_type, entry.payload,
            entry.meta, entry.position) == ("r1", 0, "w", 0, "step.finished", {"n": 1}, {"m": 2}, 1)
    assert store.journal.entries("r1").entries[0].event_id == "flows:event:2:r11:w0"
