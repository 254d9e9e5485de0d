"""Hash chain: ``fencepost.journal.verify`` detects edits, deletions, reorderings and insertions made
with raw SQL after the append-only triggers were dropped."""

from __future__ import annotations

import hashlib
import json
import sys
import time

import pytest
from sqlalchemy import event, text

import fencepost
from fencepost.journal import Head, NewEntry, head, verify
from fencepost.journal._append import content_hash, entry_hash


def _fill(store: fencepost.Store) -> None:
    # positions 1..9 over three streams, interleaved
    for i in range(9):
        store.journal.append_unfenced(f"run-{i % 3}", "step", {"i": i}, source_id="w")


def _drop_triggers(store: fencepost.Store, raw) -> None:
    on = " ON flows_journal_events" if store.db.name == "postgresql" else ""
    for name in ("flows_journal_events_no_update_v1", "flows_journal_events_no_delete_v1"):
        raw.execute(text(f"DROP TRIGGER {name}{on}"))
    raw.commit()


def _row(raw, position: int) -> dict:
    return dict(raw.execute(text("SELECT * FROM flows_journal_events WHERE position = :p"), {"p": position})
                .mappings().one())


def test_untouched_journal_verifies_and_reports_its_head(store: fencepost.Store) -> None:
    _fill(store)
    store.journal.append_many_unfenced("run-0", [NewEntry("step", {"b": k}) for k in range(3)], source_id="b")
    report = verify(store)
    assert report.ok and report.breaks == 0 and report.first_break is None
    assert (report.entries_checked, report.streams_checked) == (12, 3)
    assert report.head == head(store) and report.head is not None and report.head.position == 12
    assert verify(store, anchor=report.head).ok


def test_empty_journal_verifies(store: fencepost.Store) -> None:
    report = verify(store)
    assert report.ok and report.entries_checked == 0 and report.head is None


def test_append_only_triggers_refuse_update_and_delete(store: fencepost.Store, raw) -> None:
    _fill(store)
    for sql in ("UPDATE flows_journal_events SET payload_json = '{}'", "DELETE FROM flows_journal_events"):
        with pytest.raises(Exception):  # noqa: B017 - the driver's own error class differs per backend
            raw.execute(text(sql))
        raw.rollback()
    assert verify(store).ok


def test_edited_payload_is_detected(store: fencepost.Store, raw) -> None:
    _fill(store)
    _drop_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET payload_json = :p WHERE position = 5"), {"p": '{"i":40}'})
    raw.commit()
    report = verify(store)
    assert not report.ok
    brk = report.first_break
    assert brk is not None and (brk.position, brk.stream, brk.seq, brk.what) == (5, "run-1", 1, "content")


def test_edit_with_recomputed_hashes_is_caught_by_the_next_links(store: fencepost.Store, raw) -> None:
    """A forger who rehashes the edited entry still breaks its successors' links."""
    _fill(store)
    _drop_triggers(store, raw)
    row = _row(raw, 5)
    row["payload_json"] = '{"i":40}'
    row["content_hash"] = content_hash(row["event_type"], row["payload_json"], row["meta_json"])
    row["entry_hash"] = entry_hash(row)
    raw.execute(text("UPDATE flows_journal_events SET payload_json = :payload_json, content_hash = :content_hash,"
                     " entry_hash = :entry_hash WHERE position = 5"), row)
    raw.commit()
    brk = verify(store).first_break
    assert brk is not None and brk.position == 6 and brk.what == "log_link"


def test_deleted_entry_is_detected(store: fencepost.Store, raw) -> None:
    _fill(store)
    _drop_triggers(store, raw)
    raw.execute(text("DELETE FROM flows_journal_events WHERE position = 4"))
    raw.commit()
    report = verify(store)
    brk = report.first_break
    assert brk is not None and (brk.position, brk.what) == (5, "position")
    assert report.breaks >= 2  # the log gap and run-0's stream gap at position 7


def test_deleted_newest_entry_is_caught_by_an_anchor(store: fencepost.Store, raw) -> None:
    _fill(store)
    anchor = head(store)
    _drop_triggers(store, raw)
    raw.execute(text("DELETE FROM flows_journal_events WHERE position = 9"))
    raw.commit()
    assert verify(store).ok  # a chain alone cannot see a removed tail ...
    report = verify(store, anchor=anchor)  # ... an anchor kept elsewhere can
    assert not report.ok and report.first_break is not None and report.first_break.what == "anchor"
    assert not verify(store, anchor=Head(position=3, entry_hash="0" * 64)).ok


def test_reordered_entries_are_detected(store: fencepost.Store, raw) -> None:
    _fill(store)
    _drop_triggers(store, raw)
    # swap positions 3 and 6 (both run-0's stream would read seq 2 before seq 1 in log order)
    raw.execute(text("UPDATE flows_journal_events SET position = 1000 WHERE position = 3"))
    raw.execute(text("UPDATE flows_journal_events SET position = 3 WHERE position = 6"))
    raw.execute(text("UPDATE flows_journal_events SET position = 6 WHERE position = 1000"))
    raw.commit()
    brk = verify(store).first_break
    assert brk is not None and brk.position == 3 and brk.what in {"log_link", "entry_hash", "seq"}


def test_reordered_stream_sequence_is_detected(store: fencepost.Store, raw) -> None:
    _fill(store)
    _drop_triggers(store, raw)
    # swap seq 0 and 1 of run-2 (positions 3 and 6), keeping the log order
    raw.execute(text("UPDATE flows_journal_events SET seq = 1000 WHERE run_id = 'run-2' AND seq = 0"))
    raw.execute(text("UPDATE flows_journal_events SET seq = 0 WHERE run_id = 'run-2' AND seq = 1"))
    raw.execute(text("UPDATE flows_journal_events SET seq = 1 WHERE run_id = 'run-2' AND seq = 1000"))
    raw.commit()
    brk = verify(store).first_break
    assert brk is not None and brk.stream == "run-2" and brk.what in {"seq", "entry_hash"}


def test_inserted_entry_in_the_middle_is_detected(store: fencepost.Store, raw) -> None:
    _fill(store)
    _drop_triggers(store, raw)
    forged = _row(raw, 4)
    raw.execute(text("UPDATE flows_journal_events SET position = position + 1000 WHERE position >= 5"))
    raw.execute(text("UPDATE flows_journal_events SET position = position - 999 WHERE position >= 1000"))
    forged.update(run_id="run-forged", seq=0, event_id="forged", position=5, payload_json='{"forged":true}',
                  stream_prev_hash="0" * 64, log_prev_hash=forged["entry_hash"])
    forged["content_hash"] = content_hash(forged["event_type"], forged["payload_json"], forged["meta_json"])
    forged["entry_hash"] = hashlib.sha256(b"made up").hexdigest()
    cols = ", ".join(forged)
    raw.execute(text(f"INSERT INTO flows_journal_events ({cols}) VALUES ({', '.join(':' + c for c in forged)})"),
                forged)
    raw.commit()
    brk = verify(store).first_break
    assert brk is not None and brk.position == 5 and brk.what in {"entry_hash", "event_id"}


def test_inserted_entry_at_the_tail_with_copied_hashes_is_detected(store: fencepost.Store, raw) -> None:
    _fill(store)
    last = _row(raw, 9)
    forged = dict(last, seq=last["seq"] + 1, source_seq=last["source_seq"] + 1, position=10,
                  event_id=last["event_id"] + "x", payload_json='{"i":99}')
    cols = ", ".join(forged)
    raw.execute(text(f"INSERT INTO flows_journal_events ({cols}) VALUES ({', '.join(':' + c for c in forged)})"),
                forged)
    raw.commit()
    report = verify(store)
    assert not report.ok and report.first_break is not None and report.first_break.position == 10


def test_entry_hash_follows_the_documented_recipe_on_every_backend(store: fencepost.Store) -> None:
    """The entry hash is SHA-256 over the canonical JSON array of the stored fields and both links
    (docs/concepts/journal.md), recomputed here without fencepost's code: no backend-specific material."""
    store.journal.append_unfenced("run", "t", {"b": 1, "a": [1.5, "x"]}, source_id="p", meta={"m": None})
    (entry,) = store.journal.entries("run").entries
    payload_json, meta_json = '{"a":[1.5,"x"],"b":1}', '{"m":null}'
    material = ["run", 0, "flows:event:3:run1:p0", "p", 0, 0, "t", payload_json, meta_json, 1, "0" * 64, "0" * 64]
    expected = hashlib.sha256(json.dumps(material, separators=(",", ":")).encode()).hexdigest()
    assert entry.entry_hash == expected


@pytest.mark.parametrize("backend", ["postgresql"])
def test_verify_retried_after_a_dropped_connection_reports_no_false_break(store: fencepost.Store, monkeypatch) -> None:
    """Defect: ``verify`` kept its checker outside the read it hands to the store, so when a dropped
    connection made the store retry that read, the second pass continued from the first pass's
    state and reported an intact journal as broken (``position``: expected 6, found 1), a false
    tamper alarm. The connection is dropped for real (``pg_terminate_backend``) after the first page;
    SQLite has no connection to lose mid-read."""
    store.journal.append_many_unfenced("run", [NewEntry("step", {"i": i}) for i in range(12)], source_id="w")
    monkeypatch.setattr(sys.modules["fencepost.journal.verify"], "PAGE", 5)
    killed: list[int] = []

    def drop_after_first_page(conn, cursor, statement, params, context, executemany) -> None:
        if killed or "FROM flows_journal_events" not in statement or "LIMIT" not in statement.upper():
            return
        pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
        killed.append(pid)
        with store.db.connect() as other:
            assert other.exec_driver_sql(f"SELECT pg_terminate_backend({pid})").scalar() is True
            other.commit()
            deadline = time.monotonic() + 20
            while other.exec_driver_sql(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}").scalar():
                other.rollback()
                assert time.monotonic() < deadline, "the terminated backend never went away"
                time.sleep(0.01)

    event.listen(store.db.engine, "after_cursor_execute", drop_after_first_page)
    try:
        report = verify(store)
    finally:
        event.remove(store.db.engine, "after_cursor_execute", drop_after_first_page)
    assert killed, "the fault was never injected"
    assert report.ok, report.first_break
    assert (report.entries_checked, report.streams_checked, report.breaks) == (12, 1, 0)
    assert report.head == head(store)


def test_a_malformed_anchor_is_refused_naming_the_field_not_reported_as_a_break(store: fencepost.Store) -> None:
    """Defect: ``verify`` checked only that ``anchor`` is a ``Head``. A head read back from where the
    auditor kept it with its position as text (``Head("9", ...)``), a position no entry can have, or
    the hash upper-cased reported an intact journal as broken at the anchor ("the anchored entry is
    missing" / "has another hash"): a false tamper alarm. A malformed anchor is ``invalid_event``
    naming the field; the hash is compared case-insensitively, as the command line does."""
    from fencepost.errors import JournalError

    _fill(store)
    good = head(store)
    assert good is not None
    bad = {
        "position": [Head(position=str(good.position), entry_hash=good.entry_hash),  # type: ignore[arg-type]
                     Head(position=0, entry_hash=good.entry_hash), Head(position=2**53, entry_hash=good.entry_hash),
                     Head(position=True, entry_hash=good.entry_hash), Head(position=9.0, entry_hash=good.entry_hash)],  # type: ignore[arg-type]
        "entry_hash": [Head(position=9, entry_hash="xyz"), Head(position=9, entry_hash=good.entry_hash + "0"),
                       Head(position=9, entry_hash=None)],  # type: ignore[arg-type]
    }
    for field, anchors in bad.items():
        for anchor in anchors:
            with pytest.raises(JournalError) as caught:
                verify(store, anchor=anchor)
            assert caught.value.code == "invalid_event" and f"anchor.{field}" in str(caught.value), anchor
    upper = verify(store, anchor=Head(position=good.position, entry_hash=good.entry_hash.upper()))
    assert upper.ok, upper.first_break


def test_every_break_is_listed_not_only_the_first(store: fencepost.Store, raw, monkeypatch) -> None:
    """Defect (audit): the report carried ``first_break`` and a count, so an auditor facing two
    tampers in different places (an edited payload, a deleted entry further on) learnt where the
    first was and only that "4 breaks" existed: finding the second meant repairing the first.
    ``first_breaks`` lists them in position order, bounded (``MAX_LISTED``), ``breaks`` counts all."""
    _fill(store)
    _drop_triggers(store, raw)
    raw.execute(text("UPDATE flows_journal_events SET payload_json = :p WHERE position = 2"), {"p": '{"i":10}'})
    raw.execute(text("DELETE FROM flows_journal_events WHERE position = 6"))
    raw.commit()
    report = verify(store)
    assert not report.ok and report.breaks == len(report.first_breaks) >= 3
    assert report.first_breaks[0] == report.first_break
    listed = [(b.position, b.what) for b in report.first_breaks]
    assert listed[0] == (2, "content") and (7, "position") in listed, listed
    assert listed == sorted(listed, key=lambda p: p[0])
    # Bounded: a journal broken at every entry lists MAX_LISTED breaks and counts them all.
    monkeypatch.setattr(sys.modules["fencepost.journal.verify"], "MAX_LISTED", 2)
    capped = verify(store)
    assert capped.breaks == report.breaks and capped.first_breaks == report.first_breaks[:2]
