"""Reading streams and the log, a failing or closed database, and the receipt types: the Python
analogues of the journal's channel scenarios (UPSTREAM-TESTS B3, B6). Our journal has one write
channel (every append commits before it returns) and its readers page ``entries`` and ``log``, so a
"subscriber" or "stream" upstream is a reader paging the log here. Every test runs on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import typing

import pytest

import fencepost
from fencepost.journal import Accepted, Duplicate, NewEntry
from fencepost.journal._append import event_id_for
from fencepost.journal.entries import Receipt
from fencepost.journal.journal import MAXIMUM_ENTRIES_LIMIT, Journal
from fencepost.journal.redaction import DEFAULT
from tests.journal.conftest import A, hold, rows
from tests.worker.conftest import LockHolder, short_wait

SAFE_MAX = 2**53 - 1
_COLUMNS = ("run_id, seq, event_id, source_id, source_seq, emitted_at_ms, event_type, payload_json, meta_json,"
            " content_hash, position, stream_prev_hash, log_prev_hash, entry_hash")


def _copy_last_entry(raw, **overrides: str) -> None:
    """INSERT a copy of the newest entry with some columns replaced by SQL expressions (a row no
    append would write), then commit."""
    exprs = {"seq": "seq + 1", "event_id": "event_id || 'x'", "source_seq": "source_seq + 1",
             "position": "position + 1", **overrides}
    select = ", ".join(exprs.get(c.strip(), c.strip()) for c in _COLUMNS.split(","))
    raw.exec_driver_sql(f"INSERT INTO flows_journal_events ({_COLUMNS}) SELECT {select} FROM flows_journal_events"
                        " WHERE position = (SELECT max(position) FROM flows_journal_events)")
    raw.commit()


def _drop_checks(raw, backend: str) -> None:
    """Let the next writes store what the table's CHECK constraints refuse (a damaged database)."""
    if backend == "sqlite":
        raw.exec_driver_sql("PRAGMA ignore_check_constraints=ON")
        return
    names = raw.exec_driver_sql(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'flows_journal_events'::regclass AND contype = 'c'"
    ).scalars().all()
    for name in names:
        raw.exec_driver_sql(f'ALTER TABLE flows_journal_events DROP CONSTRAINT "{name}"')
    raw.commit()


def _boom_trigger(raw, backend: str) -> None:
    """Make the database refuse to insert an entry of type ``bad`` (a failing INSERT)."""
    if backend == "sqlite":
        raw.exec_driver_sql("CREATE TRIGGER jn_boom BEFORE INSERT ON flows_journal_events WHEN NEW.event_type = 'bad'"
                            " BEGIN SELECT RAISE(ABORT, 'boom'); END")
    else:
        raw.exec_driver_sql("CREATE FUNCTION jn_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                            " IF NEW.event_type = 'bad' THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$")
        raw.exec_driver_sql("CREATE TRIGGER jn_boom BEFORE INSERT ON flows_journal_events FOR EACH ROW"
                            " EXECUTE FUNCTION jn_boom()")
    raw.commit()


# ----------------------------------------------------------------------------- arguments and stored floors


@pytest.mark.parametrize("kwargs", [{"page_size": 0}, {"page_size": float("nan")}, {"page_size": 1.5},
                                    {"page_size": True}, {"page_size": MAXIMUM_ENTRIES_LIMIT + 1}, {"after": -1},
                                    {"after": float("nan")}],
                         ids=["page0", "page-nan", "page-float", "page-bool", "page-max+1", "after-1", "after-nan"])
def test_log_batch_options_out_of_range_are_invalid_event(store: fencepost.Store, kwargs: dict) -> None:
    """JN-01: the reader's batch size (``page_size``) of 0 or NaN, and other values outside its
    range, are ``invalid_event`` (our journal has no emit queue, so there is no capacity to give)."""
    with pytest.raises(fencepost.JournalError) as err:
        list(store.journal.log(**kwargs))
    assert err.value.code == "invalid_event"


@pytest.mark.parametrize("column", ["seq", "source_seq"])
@pytest.mark.parametrize("value", [SAFE_MAX, SAFE_MAX + 1], ids=["max-safe", "2^53"])
def test_stored_sequence_at_or_past_max_safe_is_refused_then_decode_failed(
    store: fencepost.Store, raw, backend: str, column: str, value: int
) -> None:
    """JN-02: a stored seq or source_seq of 2**53 - 1 or 2**53 cannot be written (the table's
    constraint refuses it); stored past the constraint anyway, reading it is ``decode_failed``, so
    no cursor at or past MAX_SAFE is ever handed out."""
    store.journal.append_unfenced("run", "t", {}, source_id="p")
    with pytest.raises(Exception):  # noqa: B017 - the database's own constraint error
        _copy_last_entry(raw, **{column: str(value)})
    raw.rollback()
    _drop_checks(raw, backend)
    _copy_last_entry(raw, **{column: str(value)})
    for read in (lambda: store.journal.entries("run"), lambda: list(store.journal.log())):
        with pytest.raises(fencepost.JournalError) as err:
            read()
        assert err.value.code == "decode_failed"
        assert str(value) not in str(err.value)


def test_a_negative_floor_cannot_be_stored_and_a_failing_floor_read_is_sink_failed(store: fencepost.Store,
                                                                                   raw) -> None:
    """JN-03: a stream's floor (its stored seq) of -1 is refused by the database; when the floor
    cannot be read at all (the table is gone) the append is ``sink_failed``."""
    store.journal.append_unfenced("run", "t", {}, source_id="p")
    with pytest.raises(Exception):  # noqa: B017 - the database's own constraint error
        _copy_last_entry(raw, seq="-1")
    raw.rollback()
    store.db.write(lambda c: c.exec_driver_sql("DROP TABLE flows_journal_events"))
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append_unfenced("run", "t", {}, source_id="p")
    assert err.value.code == "sink_failed"


def test_same_identity_on_the_other_channel_is_a_committed_duplicate(store: fencepost.Store) -> None:
    """JN-05: a durable row at seq 3, sourceSeq 5, ``{value: 1}``; the same identity and payload
    appended on the other channel (unfenced after fenced, and again fenced) is
    ``Duplicate{seq 3, sourceSeq 5, committed}``; one row."""
    hold(store, "run", A)
    for i in range(3):
        store.journal.append_unfenced("run", "t", {"i": i}, source_id="other")
    first = store.journal.append("run", "t", {"value": 1}, owner=A, source_id="producer", source_seq=5)
    assert (type(first), first.seq, first.source_seq) == (Accepted, 3, 5)
    for again in (store.journal.append_unfenced("run", "t", {"value": 1}, source_id="producer", source_seq=5),
                  store.journal.append("run", "t", {"value": 1}, owner=A, source_id="producer", source_seq=5)):
        assert again == Duplicate(seq=3, source_seq=5, position=first.position, status="committed")
    assert [r[1] for r in rows(store, "run")] == [0, 1, 2, 3]


def test_an_append_is_persisted_before_it_returns_stamped_by_the_store_clock(store: fencepost.Store,
                                                                          clock) -> None:
    """JN-11 (analogue: our one channel never answers before persisting): the receipt
    ``Accepted{seq 0, sourceSeq 0}`` comes back with the entry already readable, no flush needed,
    and its ``emitted_at_ms`` is the store clock's 1 000."""
    clock.set(1_000)
    receipt = store.journal.append_unfenced("run", "t", {"v": 1}, source_id="p")
    assert (type(receipt), receipt.seq, receipt.source_seq) == (Accepted, 0, 0)
    (entry,) = store.journal.entries("run").entries
    assert (entry.seq, entry.emitted_at_ms, entry.payload) == (0, 1_000, {"v": 1})


# ----------------------------------------------------------------------------- readers


def test_an_empty_run_reads_empty_and_more_than_one_page_reads_completely(store: fencepost.Store) -> None:
    """JN-14: an empty run reads nothing (no error); MAXIMUM_ENTRIES_LIMIT + 1 entries read
    completely, through ``entries`` pages and through ``log`` at its largest page size."""
    page = store.journal.entries("run")
    assert (page.entries, page.has_more) == ([], False)
    assert list(store.journal.log(page_size=MAXIMUM_ENTRIES_LIMIT)) == []
    n = MAXIMUM_ENTRIES_LIMIT + 1
    store.journal.append_many_unfenced("run", [NewEntry("t", {"i": i}) for i in range(n)], source_id="p")
    first = store.journal.entries("run", limit=MAXIMUM_ENTRIES_LIMIT)
    assert len(first.entries) == MAXIMUM_ENTRIES_LIMIT and first.has_more
    rest = store.journal.entries("run", after=first.entries[-1].seq, limit=MAXIMUM_ENTRIES_LIMIT)
    assert [e.seq for e in rest.entries] == [n - 1] and not rest.has_more
    assert [e.payload["i"] for e in store.journal.log(page_size=MAXIMUM_ENTRIES_LIMIT)] == list(range(n))


def test_a_reader_of_the_log_gets_the_entry_with_its_event_id(store: fencepost.Store) -> None:
    """JN-19: a reader following the log receives the committed entry with the same event id (and
    position) the append produced."""
    start = max((e.position for e in store.journal.log()), default=0)
    receipt = store.journal.append_unfenced("run", "t", {"v": 1}, source_id="p", source_seq=4)
    (seen,) = list(store.journal.log(after=start))
    assert seen.event_id == event_id_for("run", "p", 4) == store.journal.entries("run").entries[0].event_id
    assert (seen.position, seen.seq, seen.source_seq) == (receipt.position, receipt.seq, 4)


def test_an_append_whose_caller_fails_right_after_commit_is_still_read_and_deduplicated(
    store: fencepost.Store
) -> None:
    """JN-20 analogue: the append's COMMIT lands but its caller is interrupted before it gets the
    receipt. The row exists, readers of the log see it, and the retry is a ``Duplicate`` of it."""

    class Interrupted(Exception):
        pass

    real = store.db.write

    def write_then_fail(fn):
        real(fn)
        raise Interrupted

    store.db.write = write_then_fail  # type: ignore[method-assign]
    try:
        with pytest.raises(Interrupted):
            store.journal.append_unfenced("run", "t", {"v": 1}, source_id="p", source_seq=0)
    finally:
        store.db.write = real  # type: ignore[method-assign]
    assert [(e.seq, e.payload) for e in store.journal.log()] == [(0, {"v": 1})]
    again = store.journal.append_unfenced("run", "t", {"v": 1}, source_id="p", source_seq=0)
    assert type(again) is Duplicate and again.seq == 0
    assert len(rows(store, "run")) == 1


def test_entries_handed_to_readers_cannot_change_what_others_read(store: fencepost.Store) -> None:
    """JN-21 (Python analogue): an entry is a frozen struct (assigning a field raises); mutating the
    payload object one reader got changes neither another reader's entry nor the stored row."""
    store.journal.append_unfenced("run", "t", {"v": {"n": 1}}, source_id="p")
    mine = store.journal.entries("run").entries[0]
    with pytest.raises(AttributeError):
        mine.payload = {}  # type: ignore[misc]
    mine.payload["v"]["n"] = 99
    theirs = next(iter(store.journal.log()))
    assert theirs.payload == {"v": {"n": 1}}
    assert store.journal.entries("run").entries[0].payload == {"v": {"n": 1}}
    assert rows(store, "run")[0][4] == '{"v":{"n":1}}'


def test_a_reader_replaying_history_while_an_entry_commits_sees_it_once(store: fencepost.Store) -> None:
    """JN-22: a log reader that has replayed entry 0 while entry 1 commits yields exactly [0, 1]."""
    store.journal.append_unfenced("run", "t", {"i": 0}, source_id="p")
    reader = store.journal.log(page_size=1)
    got = [next(reader).seq]
    store.journal.append_unfenced("run", "t", {"i": 1}, source_id="p")
    got += [e.seq for e in reader]
    assert got == [0, 1]


def test_reading_after_seq_2_in_batches_of_3_yields_3_to_22(store: fencepost.Store) -> None:
    """JN-23: 23 entries, read after seq 2 in batches of 3 (``entries`` pages, and the log from the
    position of seq 2): seqs 3..22."""
    store.journal.append_many_unfenced("run", [NewEntry("t", {"i": i}) for i in range(23)], source_id="p")
    seen, after = [], 2
    while True:
        page = store.journal.entries("run", after=after, limit=3)
        seen += [e.seq for e in page.entries]
        if not page.has_more:
            break
        after = page.entries[-1].seq
    assert seen == list(range(3, 23))
    pos2 = store.journal.entries("run").entries[2].position
    assert [e.seq for e in store.journal.log(after=pos2, page_size=3)] == list(range(3, 23))


def test_two_readers_of_one_stream_close_without_hanging(store: fencepost.Store) -> None:
    """JN-24 (analogue): two readers of one run's entries, each stopped part way, close at once and
    leave the store usable."""
    store.journal.append_many_unfenced("run", [NewEntry("t", {"i": i}) for i in range(5)], source_id="p")
    one, two = store.journal.log(page_size=2), store.journal.log(page_size=2)
    assert next(one).seq == 0 and next(two).seq == 0 and next(two).seq == 1
    one.close()
    two.close()
    assert store.journal.append_unfenced("run", "t", {}, source_id="p").seq == 5


def test_a_reader_fails_read_failed_when_the_database_fails_under_it(store: fencepost.Store) -> None:
    """JN-31 (analogue): a reader paging the log fails with the journal's read failure when the
    database fails between its pages (upstream's live stream fails ``sink_failed``; a read here is
    ``read_failed``)."""
    store.journal.append_many_unfenced("run", [NewEntry("t", {"i": i}) for i in range(3)], source_id="p")
    reader = store.journal.log(page_size=1)
    assert next(reader).seq == 0
    store.db.write(lambda c: c.exec_driver_sql("DROP TABLE flows_journal_events"))
    with pytest.raises(fencepost.JournalError) as err:
        next(reader)
    assert err.value.code == "read_failed"


def test_a_foreign_row_committed_by_another_connection_is_counted_by_the_next_append(
    store: fencepost.Store, db_url: str
) -> None:
    """JN-44: after this store appended seq 0, another connection appends seq 1; this store's next
    append gets seq 2. Order: producer, external, other-producer."""
    assert store.journal.append_unfenced("run", "t", {}, source_id="producer").seq == 0
    with fencepost.open(db_url, clock=store.clock) as other:
        assert other.journal.append_unfenced("run", "t", {}, source_id="external").seq == 1
    assert store.journal.append_unfenced("run", "t", {}, source_id="other-producer").seq == 2
    assert [r[2] for r in rows(store, "run")] == ["producer", "external", "other-producer"]


# ----------------------------------------------------------------------------- a failing database


def test_one_failing_insert_rolls_back_the_whole_batch(store: fencepost.Store, raw, backend: str) -> None:
    """JN-28 (analogue): one entry of a batch whose INSERT the database refuses rolls the whole
    batch back: ``sink_failed``, no entries; the next append is seq 0."""
    _boom_trigger(raw, backend)
    batch = [NewEntry("ok", {"i": 0}), NewEntry("bad", {"i": 1}), NewEntry("ok", {"i": 2})]
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append_many_unfenced("run", batch, source_id="p")
    assert err.value.code == "sink_failed"
    assert rows(store, "run") == []
    assert store.journal.append_unfenced("run", "ok", {}, source_id="p").seq == 0


def test_appends_fail_while_the_database_is_unavailable_and_work_again_after(db_url: str, backend: str) -> None:
    """JN-30, JN-32, JN-33 (analogues; our one channel is the durable one): while another connection
    holds the write lock past the store's wait, an append is ``sink_failed`` (transient) and writes
    nothing; once the database answers, the identity whose write was lost (sourceSeq 7) is admitted
    ``Accepted`` (one row), and later appends go on gapless."""
    store = fencepost.open(short_wait(db_url, backend))
    holder = LockHolder(db_url, backend)
    try:
        hold(store, "run", A)
        assert store.journal.append("run", "t", {"i": 0}, owner=A, source_id="p").seq == 0
        holder.hold()
        with pytest.raises(fencepost.JournalError) as err:  # one call: each waits out the store's retries
            store.journal.append("run", "t", {"i": 7}, owner=A, source_id="p", source_seq=7)
        assert err.value.code == "sink_failed" and err.value.transient is True  # type: ignore[attr-defined]
        assert len(rows(store, "run")) == 1
        holder.free()
        again = store.journal.append("run", "t", {"i": 7}, owner=A, source_id="p", source_seq=7)
        assert (type(again), again.seq, again.source_seq) == (Accepted, 1, 7)
        assert store.journal.append_unfenced("run", "t", {"i": 8}, source_id="q").seq == 2
        assert [(r[1], r[2], r[3]) for r in rows(store, "run")] == [(0, "p", 0), (1, "p", 7), (2, "q", 0)]
    finally:
        holder.close()
        store.close()


def test_a_closed_store_journal_is_journal_closed(db_url: str) -> None:
    """JN-36 (analogue): after the store was closed, appends and reads are ``journal_closed`` (not
    a database failure a caller might retry), and say the store is closed."""
    store = fencepost.open(db_url)
    store.journal.append_unfenced("run", "t", {}, source_id="p")
    store.close()
    for call in (lambda: store.journal.append_unfenced("run", "t", {}, source_id="p"),
                 lambda: store.journal.append("run", "t", {}, owner=A, source_id="p"),
                 lambda: store.journal.transact(lambda tx: None),
                 lambda: store.journal.entries("run"),
                 lambda: list(store.journal.log())):
        with pytest.raises(fencepost.JournalError) as err:
            call()
        assert err.value.code == "journal_closed", err.value
        assert "the store is closed" in str(err.value)


# ----------------------------------------------------------------------------- receipts


def test_an_append_receipt_is_only_ever_accepted_or_duplicate(store: fencepost.Store) -> None:
    """JG-08 (the type pin; there is no lossy channel to drop from): every append method is typed
    to return ``Accepted | Duplicate`` and those are the only receipt classes there are."""
    assert set(Receipt.__subclasses__()) == {Accepted, Duplicate}
    for name in ("append", "append_unfenced"):
        assert typing.get_type_hints(getattr(Journal, name))["return"] == Accepted | Duplicate
    for name in ("append_many", "append_many_unfenced"):
        assert typing.get_type_hints(getattr(Journal, name))["return"] == list[Accepted | Duplicate]
    hold(store, "run", A)
    got = [store.journal.append("run", "t", {}, owner=A, source_id="p", source_seq=0),
           store.journal.append_unfenced("run", "t", {}, source_id="p", source_seq=0),
           *store.journal.append_many_unfenced("run", [NewEntry("t", {}, source_seq=1)], source_id="p")]
    assert [type(r) for r in got] == [Accepted, Duplicate, Accepted]


# ----------------------------------------------------------------------------- redaction on every channel


def test_a_literal_proto_member_stays_an_own_member_redacted_inside(store: fencepost.Store) -> None:
    """RD-21 (Python analogue): keys that name object machinery (``__proto__``, ``__class__``,
    ``constructor``) are ordinary members: kept as such, their credential members redacted."""
    payload = {name: {"token": "raw-secret", "keep": 1} for name in ("__proto__", "__class__", "constructor")}
    store.journal.append_unfenced("run", "t", payload, source_id="p")
    stored = store.journal.entries("run").entries[0].payload
    assert stored == {name: {"token": "[REDACTED]", "keep": 1} for name in payload}
    assert "raw-secret" not in rows(store, "run")[0][4]


def test_the_unfenced_and_batch_channels_redact_too(store: fencepost.Store) -> None:
    """RD-25 (analogue; upstream's lossy channel is our unfenced and batch appends):
    ``{secret: "hunter2"}`` is stored as ``[REDACTED]``."""
    store.journal.append_unfenced("run", "t", {"secret": "hunter2"}, source_id="p")
    store.journal.append_many_unfenced("run", [NewEntry("t", {"secret": "hunter2"})], source_id="p")
    assert [e.payload for e in store.journal.entries("run").entries] == [{"secret": "[REDACTED]"}] * 2
    assert all("hunter2" not in r[4] for r in rows(store, "run"))


def test_json_text_is_redacted_as_json_and_other_text_passes_through() -> None:
    """RD-30 (analogue, no database): a string holding JSON text is redacted as the JSON value it
    encodes and stays JSON (``{"token":"raw"}``); text that is not valid JSON passes through the
    value walk untouched apart from the textual rules. A redactor that fails is RD-31 (the journal
    refuses the entry)."""
    out = DEFAULT({"s": '{"token":"raw"}'})["s"]
    assert json.loads(out) == {"token": "[REDACTED]"}
    for not_json in ('{"token":', "[1, 2", "{not json}"):
        assert DEFAULT({"s": not_json})["s"] == not_json
