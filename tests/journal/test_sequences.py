"""Sequences, idempotency, validation and reads (UPSTREAM-TESTS B5, B6)."""

from __future__ import annotations

import hashlib
from functools import partial

import pytest
from sqlalchemy import text

import fencepost
from fencepost._values import SAFE_MAX
from fencepost.clock import ManualClock
from fencepost.journal import (
    COMPANION_PREFIX,
    Accepted,
    Duplicate,
    NewEntry,
    companion_stream,
    is_companion_run_id,
)
from fencepost.journal._append import event_id_for
from tests.conftest import race_threads
from tests.journal.conftest import rows

# ----------------------------------------------------------------------------- companion streams (B5)


def test_companion_ids_are_distinct_recognised_bounded_and_deterministic() -> None:
    """CS-01: ids for (run-store,a), (run-store,b), (other,a), (run-store, 1024*r) differ, are
    companion ids, at most 1 024 chars and deterministic; "run-x" is not a companion id."""
    ids = [companion_stream("a"), companion_stream("b"), companion_stream("a", "other"),
           companion_stream("r" * 1024)]
    assert len(set(ids)) == 4
    assert all(is_companion_run_id(i) and len(i) <= 1024 for i in ids)
    assert ids == [companion_stream("a"), companion_stream("b"), companion_stream("a", "other"),
                   companion_stream("r" * 1024)]
    assert not is_companion_run_id("run-x")


@pytest.mark.parametrize("run_id", ["a", "", "run-é-😀", "x" * 55, "x" * 56, "x" * 64, "y" * 1000])
def test_companion_id_is_prefix_stream_and_sha256_of_utf8(run_id: str) -> None:
    """CS-02: id = "flows.companion/run-store/" + hex(sha256(utf8(runId)))."""
    expected = "flows.companion/run-store/" + hashlib.sha256(run_id.encode("utf-8")).hexdigest()
    assert companion_stream(run_id) == expected
    assert expected.startswith(COMPANION_PREFIX)


# ----------------------------------------------------------------------------- sequences (B6)


def test_seq_per_stream_and_source_seq_per_producer(store: fencepost.Store) -> None:
    """JN-12: (r1,pa), (r1,pb), (r1,pa), (r2,pa) -> (seq, sourceSeq) (0,0), (1,0), (2,1), (0,0)."""
    j = store.journal
    got = [
        j.append_unfenced("r1", "t", {}, source_id="pa"),
        j.append_unfenced("r1", "t", {}, source_id="pb"),
        j.append_unfenced("r1", "t", {}, source_id="pa"),
        j.append_unfenced("r2", "t", {}, source_id="pa"),
    ]
    assert [(r.seq, r.source_seq) for r in got] == [(0, 0), (1, 0), (2, 1), (0, 0)]
    assert [r.position for r in got] == [1, 2, 3, 4]


def test_next_seq_and_source_seq_follow_existing_rows(store: fencepost.Store) -> None:
    """JN-04: with rows up to seq 3 and producer source_seq 6 stored, the next receipt is {seq 4, sourceSeq 7}."""
    j = store.journal
    for s in (0, 1, 2):
        j.append_unfenced("run", "t", {"s": s}, source_id="other", source_seq=s)
    j.append_unfenced("run", "t", {}, source_id="producer", source_seq=6)
    assert j.append_unfenced("run", "t", {}, source_id="producer") == Accepted(seq=4, source_seq=7, position=5)


def test_seq_floor_at_max_safe_refuses_the_append(store: fencepost.Store, raw) -> None:
    """JN-06: the stream's last seq is 2^53-2, so the next would be 2^53-1: invalid_event, nothing written."""
    store.journal.append_unfenced("run", "t", {}, source_id="p")
    raw.execute(text("DROP TRIGGER IF EXISTS flows_journal_events_no_update_v1" + (
        " ON flows_journal_events" if store.db.name == "postgresql" else "")))
    raw.execute(text("UPDATE flows_journal_events SET seq = :s"), {"s": SAFE_MAX - 1})
    raw.commit()
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append_unfenced("run", "t", {}, source_id="q")
    assert err.value.code == "invalid_event"
    assert "safe integer range" in str(err.value)
    assert len(rows(store)) == 1


def test_producer_floor_at_max_safe_without_explicit_source_seq_is_refused(store: fencepost.Store) -> None:
    """JN-08: producer's last source_seq is 2^53-2; an append without source_seq is invalid_event."""
    store.journal.append_unfenced("run", "t", {}, source_id="p", source_seq=SAFE_MAX - 1)
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append_unfenced("run", "t", {}, source_id="p")
    assert err.value.code == "invalid_event"
    assert "journal sequence is outside the allocatable safe integer range" in str(err.value)


@pytest.mark.parametrize("store", ["group", "single"], indirect=True)
def test_fifty_concurrent_producers_on_one_run_get_seqs_zero_to_49(store: fencepost.Store) -> None:
    """JN-13: 50 threads released at one barrier append to one run: seqs are exactly 0..49."""
    got = race_threads([partial(store.journal.append_unfenced, "run", "t", {"i": i}, source_id=f"p{i}")
                        for i in range(50)])
    assert [r for r in got if isinstance(r, BaseException)] == []
    assert sorted(r[1] for r in rows(store, "run")) == list(range(50))


def test_refused_append_leaves_no_gap(store: fencepost.Store) -> None:
    """JN-17 / JN-52 analogue: refused appends (bad payload, conflict, fence) allocate nothing."""
    j = store.journal
    j.append_unfenced("run", "t", {"v": 1}, source_id="p", source_seq=0)
    with pytest.raises(fencepost.JournalError):
        j.append_unfenced("run", "t", {"bad": {1, 2}}, source_id="p")
    with pytest.raises(fencepost.JournalError):
        j.append_unfenced("run", "t", {"v": 2}, source_id="p", source_seq=0)
    with pytest.raises(fencepost.JournalError):
        j.append("run", "t", {}, owner=fencepost.OwnerId("h", 1, "n"), source_id="p")
    assert j.append_unfenced("run", "t", {"v": 3}, source_id="p") == Accepted(seq=1, source_seq=1, position=2)


# ----------------------------------------------------------------------------- idempotency


def test_same_identity_other_content_is_idempotency_conflict(store: fencepost.Store) -> None:
    """JN-43: after commit, the same identity with another payload is idempotency_conflict; stored stays."""
    j = store.journal
    j.append_unfenced("run", "t", {"value": 1}, source_id="producer", source_seq=0)
    with pytest.raises(fencepost.JournalError) as err:
        j.append_unfenced("run", "t", {"value": 2}, source_id="producer", source_seq=0)
    assert err.value.code == "idempotency_conflict"
    assert "producer:0" in str(err.value)
    assert "value" not in str(err.value)
    assert j.entries("run").entries[0].payload == {"value": 1}


def test_identity_dedupe_keeps_the_first_row(store: fencepost.Store) -> None:
    """JN-42: dedupe="identity": the first row stands, the retry is Duplicate whatever its content."""
    j = store.journal
    j.append_unfenced("run", "t", {"value": 1}, source_id="p", source_seq=5)
    again = j.append_unfenced("run", "t", {"value": 2}, source_id="p", source_seq=5, dedupe="identity")
    assert again == Duplicate(seq=0, source_seq=5, position=1)
    assert [e.payload for e in j.entries("run").entries] == [{"value": 1}]


def test_content_dedupe_ignores_key_order_and_int_float_but_not_bool(store: fencepost.Store) -> None:
    """Same content = same JSON value: key order and 1 vs 1.0 do not matter; true is not 1."""
    j = store.journal
    j.append_unfenced("run", "t", {"a": 1, "b": 2}, source_id="p", source_seq=0)
    assert isinstance(j.append_unfenced("run", "t", {"b": 2, "a": 1.0}, source_id="p", source_seq=0), Duplicate)
    with pytest.raises(fencepost.JournalError) as err:
        j.append_unfenced("run", "t", {"a": True, "b": 2}, source_id="p", source_seq=0)
    assert err.value.code == "idempotency_conflict"


def test_other_event_type_or_meta_is_a_conflict(store: fencepost.Store) -> None:
    j = store.journal
    j.append_unfenced("run", "t", {}, source_id="p", source_seq=0, meta={"m": 1})
    for kwargs in ({"event_type": "u", "meta": {"m": 1}}, {"event_type": "t", "meta": {"m": 2}}):
        with pytest.raises(fencepost.JournalError) as err:
            j.append_unfenced("run", kwargs["event_type"], {}, source_id="p", source_seq=0, meta=kwargs["meta"])
        assert err.value.code == "idempotency_conflict"


def test_batch_with_a_conflicting_identity_writes_nothing(store: fencepost.Store) -> None:
    """JN-29 analogue: a batch of sourceSeq 0,1,2 where 0 exists with other content is refused whole."""
    j = store.journal
    j.append_unfenced("run", "t", {"external": True}, source_id="producer", source_seq=0)
    batch = [NewEntry("t", {"i": i}, source_seq=i) for i in range(3)]
    with pytest.raises(fencepost.JournalError) as err:
        j.append_many_unfenced("run", batch, source_id="producer")
    assert err.value.code == "idempotency_conflict"
    assert "producer:0" in str(err.value)
    assert len(rows(store)) == 1


def test_batch_receipts_in_order_with_in_batch_duplicates(store: fencepost.Store) -> None:
    j = store.journal
    got = j.append_many_unfenced(
        "run", [NewEntry("t", {"i": 0}, source_seq=3), NewEntry("t", {"i": 1}), NewEntry("t", {"i": 0}, source_seq=3)],
        source_id="p",
    )
    assert got == [Accepted(0, 3, 1), Accepted(1, 4, 2), Duplicate(0, 3, 1)]


def test_event_id_is_injective_over_tricky_triples_and_deterministic() -> None:
    """JN-46: length prefixes keep ("run:source","",0) apart from ("run",":source",0) and friends."""
    triples = [("run:source", "", 0), ("run", ":source", 0), ("ru", "nsource", 0), ("run1", "source", 0),
               ("run", "source1", 0), ("run", "source", 10), ("run", "source1", 0)]
    ids = {t: event_id_for(*t) for t in triples}
    assert len(set(ids.values())) == len(set(triples))
    assert event_id_for("run", "source", 1) == event_id_for("run", "source", 1)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"run_id": ""}, "run_id"),
        ({"source_id": ""}, "source_id"),
        ({"event_type": ""}, "event_type"),
        ({"run_id": "r\ud800"}, "run_id"),
        ({"source_id": "s\ud800"}, "source_id"),
        ({"event_type": "t\ud800"}, "event_type"),
        ({"run_id": "r\x00"}, "run_id"),
        ({"event_type": "t\x00"}, "event_type"),
        ({"run_id": "r" * 1025}, "run_id"),
        ({"source_seq": -1}, "source_seq"),
        ({"source_seq": SAFE_MAX}, "source_seq"),
        ({"source_seq": 1.0}, "source_seq"),
        ({"source_seq": True}, "source_seq"),
        ({"payload": float("nan")}, "payload"),
        ({"payload": {"k": {1, 2}}}, "payload"),
        ({"payload": {1: "int key"}}, "payload"),
        ({"meta": {"k": object()}}, "meta"),
        ({"dedupe": "bytes"}, "dedupe"),
    ],
    ids=lambda v: v if isinstance(v, str) else next(iter(v)),
)
def test_bad_input_is_invalid_event_naming_the_field(store: fencepost.Store, kwargs: dict, field: str) -> None:
    """JN-07 / JN-09 / JN-48 / JN-49: empty, lone-surrogate, NUL, over-long ids; bad source_seq; non-JSON
    payload or meta: invalid_event naming the field and nothing written."""
    args = {"run_id": "run", "event_type": "t", "payload": {}, "source_id": "p", **kwargs}
    run_id, event_type, payload = args.pop("run_id"), args.pop("event_type"), args.pop("payload")
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.append_unfenced(run_id, event_type, payload, **args)
    assert err.value.code == "invalid_event"
    assert field in str(err.value)
    assert rows(store) == []


def test_clock_before_epoch_is_invalid_event(db_url: str) -> None:
    """JN-09: a clock reading of -1 cannot stamp an entry."""
    with fencepost.open(db_url, clock=ManualClock(-1)) as store:
        with pytest.raises(fencepost.JournalError) as err:
            store.journal.append_unfenced("run", "t", {}, source_id="p")
        assert err.value.code == "invalid_event"
        assert rows(store) == []


def test_astral_identifiers_round_trip(store: fencepost.Store, clock) -> None:
    """JN-07 / JN-50: astral run, source and type ids are stored and read back exactly."""
    clock.set(1000)
    store.journal.append_unfenced("run-😀", "type-𝄞", {"v": "é😀"}, source_id="src-😀")
    (entry,) = store.journal.entries("run-😀").entries
    assert (entry.run_id, entry.event_type, entry.source_id, entry.payload) == ("run-😀", "type-𝄞", "src-😀",
                                                                                 {"v": "é😀"})
    assert entry.emitted_at_ms == 1000


def test_five_mib_payload_is_accepted(store: fencepost.Store) -> None:
    """JN-18: there is no byte cap by default."""
    blob = "x" * (5 * 1024 * 1024)
    assert store.journal.append_unfenced("run", "t", {"blob": blob}, source_id="p").seq == 0
    assert store.journal.entries("run").entries[0].payload == {"blob": blob}


# ----------------------------------------------------------------------------- reads


def test_entries_pages_with_has_more(store: fencepost.Store) -> None:
    """JN-25: 5 entries read with limit 2: has_more true, true, false; seqs 0..4."""
    for i in range(5):
        store.journal.append_unfenced("run", "t", {"i": i}, source_id="p")
    seen, after, flags = [], None, []
    while True:
        page = store.journal.entries("run", after=after, limit=2)
        seen += [e.seq for e in page.entries]
        flags.append(page.has_more)
        if not page.has_more:
            break
        after = page.entries[-1].seq
    assert seen == [0, 1, 2, 3, 4]
    assert flags == [True, True, False]


def test_entries_filters_by_event_type(store: fencepost.Store) -> None:
    for t in ("a", "b", "a", "c"):
        store.journal.append_unfenced("run", t, {}, source_id="p")
    assert [e.seq for e in store.journal.entries("run", event_types=["a", "c"]).entries] == [0, 2, 3]
    assert store.journal.entries("run", event_types=[]).entries == []


@pytest.mark.parametrize(
    "kwargs",
    [{"run_id": ""}, {"run_id": "r\ud800"}, {"run_id": "r" * 1025}, {"limit": 0}, {"limit": 10_001},
     {"limit": 1.5}, {"after": -2}, {"after": float("nan")}, {"event_types": ["t"] * 65}, {"event_types": "t"}],
    ids=["empty", "surrogate", "1025", "limit0", "limit-max+1", "limit-float", "after-2", "after-nan", "65types",
         "types-str"],
)
def test_entries_bad_arguments_are_invalid_event(store: fencepost.Store, kwargs: dict) -> None:
    """JN-10 / JN-26 / JN-48: bad run id, limit or after on entries are invalid_event."""
    args = {"run_id": "run", **kwargs}
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.entries(args.pop("run_id"), **args)
    assert err.value.code == "invalid_event"


def test_entries_limit_at_maximum_is_allowed(store: fencepost.Store) -> None:
    """JN-26: limit = 10 000 is accepted."""
    assert store.journal.entries("run", limit=10_000).has_more is False


def test_log_iterates_every_entry_in_position_order(store: fencepost.Store) -> None:
    for i in range(7):
        store.journal.append_unfenced(f"r{i % 3}", "t", {"i": i}, source_id="p")
    all_entries = list(store.journal.log(page_size=2))
    assert [e.position for e in all_entries] == list(range(1, 8))
    assert [e.payload["i"] for e in all_entries] == list(range(7))
    assert [e.position for e in store.journal.log(after=5)] == [6, 7]


def test_dropped_events_table_is_read_failed(store: fencepost.Store) -> None:
    """JN-45 (last case): the events table is gone: read_failed."""
    store.db.write(lambda c: c.exec_driver_sql("DROP TABLE flows_journal_events"))
    with pytest.raises(fencepost.JournalError) as err:
        store.journal.entries("run")
    assert err.value.code == "read_failed"
