"""Snapshot reads (UPSTREAM-TESTS C1 ES-01..03, 07, 08, 10, 11; C2 EB-01..05; C3 EC-02, EI-01)."""

from __future__ import annotations

import hashlib

import msgspec
import pytest
from sqlalchemy import event, text

import fencepost
from fencepost import Missing, Observed, OwnerId, Position
from fencepost.changefeed.snapshot import Corrupt, check_batch
from fencepost.changefeed.types import Acknowledgement, Batch, Cancellation, Waiting
from tests.changefeed.conftest import delete_run, insert_run, update_run

OWNER = OwnerId("host-a", 101, "owner-a")


def _suspend(conn, run_id, reason, *, token="token", wake=123, **extra):
    insert_run(conn, run_id, status="suspended", waiting_reason=reason, waiting_token=token,
               waiting_wake_at_ms=wake, **extra)


def test_read_answers_in_request_order_with_duplicates_and_waiting_kinds(store, raw):
    """ES-01: request order kept with the duplicate; waiting kinds mapped; absent is Missing(deleted=False)."""
    insert_run(raw, "root", status="completed", finished_at_ms=4)
    insert_run(raw, "parent")
    _suspend(raw, "timer", "timer", parent_run_id="root")
    for reason in ("event", "signal", "approval", "quota", "human", "custom"):
        _suspend(raw, reason, reason)
    insert_run(raw, "round", parent_run_id="root", lineage_id="root", round_ordinal=1)
    raw.commit()
    ids = ["timer", "root", "round", "absent", "event", "signal", "approval", "quota", "human", "custom", "root"]
    batch = store.feed.read(ids)
    assert [s.run_id for s in batch.snapshots] == ids
    assert batch.snapshots[1] == batch.snapshots[-1]
    timer = batch.snapshots[0]
    assert isinstance(timer, Observed)
    assert timer.parent_run_id == "root" and timer.status == "suspended" and timer.flow_name == "flow"
    assert timer.waiting == Waiting("timer", "timer", 123, hashlib.sha256(b"token").hexdigest(), None)
    root = batch.snapshots[1]
    assert (root.parent_run_id, root.lineage_id, root.round_ordinal, root.waiting) == (None, "root", 0, None)
    assert (root.status, root.finished_at_ms) == ("completed", 4)
    rnd = batch.snapshots[2]
    assert (rnd.parent_run_id, rnd.lineage_id, rnd.round_ordinal) == ("root", "root", 1)
    assert batch.snapshots[3] == Missing("absent", batch.source, batch.revision, False)
    kinds = [s.waiting.kind for s in batch.snapshots[4:10]]
    assert kinds == ["signal", "signal", "approval", "quota", "human", "other"]
    assert all(s.revision <= batch.revision and s.source == batch.source for s in batch.snapshots)


def test_explicit_parent_change_is_newer(store, raw):
    """ES-02: moving the parent advances the revision; is_newer is strict and source-bound."""
    insert_run(raw, "root")
    insert_run(raw, "parent")
    insert_run(raw, "timer", parent_run_id="root")
    raw.commit()
    before = store.feed.read(["timer"]).snapshots[0]
    update_run(raw, "timer", parent_run_id="parent")
    raw.commit()
    after = store.feed.read(["timer"]).snapshots[0]
    assert after.parent_run_id == "parent"
    assert fencepost.is_newer(after, before)
    assert not fencepost.is_newer(before, after)
    assert not fencepost.is_newer(after, after)
    other = msgspec.structs.replace(after, source="f" * 32 if after.source != "f" * 32 else "e" * 32)
    assert not fencepost.is_newer(other, before)


def test_read_bounds_are_0_to_200_ids(store, raw):
    """ES-03: [] returns only the position; 199 and 200 ids are fine; 201 is decode_failed."""
    insert_run(raw, "a")
    raw.commit()
    empty = store.feed.read([])
    assert empty.snapshots == [] and Position(empty.source, empty.revision) == store.feed.position()
    assert len(store.feed.read([f"x{i}" for i in range(199)]).snapshots) == 199
    assert len(store.feed.read(["a"] * 200).snapshots) == 200
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.read([f"x{i}" for i in range(201)])
    assert err.value.code == "decode_failed"


def test_cancellation_and_acknowledgement_are_observed(store, raw):
    """ES-07: request at 2 -> acknowledgement null; ack at 3 then cancel -> status cancelled with the ack."""
    insert_run(raw, "a", status="running", owner_host_id="host-a", owner_pid=101, owner_nonce="owner-a",
               heartbeat_at_ms=1, started_at_ms=1)
    raw.commit()
    update_run(raw, "a", cancel_requested_at_ms=2)
    raw.commit()
    snap = store.feed.read(["a"]).snapshots[0]
    assert snap.owner == OWNER and snap.cancellation == Cancellation(2, None)
    ack = '{"observedAtMs": 3, "owner": {"hostId": "host-a", "pid": 101, "nonce": "owner-a"}}'
    update_run(raw, "a", cancel_acknowledgement_json=ack)
    raw.commit()
    update_run(raw, "a", status="cancelled", owner_host_id=None, owner_pid=None, owner_nonce=None,
               heartbeat_at_ms=None, finished_at_ms=4)
    raw.commit()
    snap = store.feed.read(["a"]).snapshots[0]
    assert snap.status == "cancelled" and snap.owner is None
    assert snap.cancellation == Cancellation(2, Acknowledgement(3, OWNER))


def test_a_read_is_one_snapshot_even_when_a_peer_commits_midway(store, raw):
    """ES-08: a peer completes the run between the read's position query and its row query."""
    _suspend(raw, "a", "timer")
    raw.commit()
    done = []

    @event.listens_for(store.db.engine, "before_cursor_execute")
    def peer_commits(conn, cursor, statement, params, context, executemany):
        if "flows_run_changes" in statement and "JOIN" in statement and not done:
            done.append(True)
            update_run(raw, "a", status="completed", waiting_reason=None, waiting_token=None,
                       waiting_wake_at_ms=None, finished_at_ms=9)
            raw.commit()

    try:
        first = store.feed.read(["a"])
    finally:
        event.remove(store.db.engine, "before_cursor_execute", peer_commits)
    assert done
    snap = first.snapshots[0]
    assert snap.status == "suspended" and snap.waiting.kind == "timer"
    assert snap.revision == first.revision == 1
    later = store.feed.read(["a"]).snapshots[0]
    assert later.status == "completed" and later.waiting is None and later.revision == 2


def test_a_failed_read_leaks_no_transaction(store, raw):
    """ES-09 (the part that applies): a failing read leaves the store usable and the feed moving."""
    insert_run(raw, "a")
    raw.commit()
    raw.exec_driver_sql("UPDATE flows_run_changes SET revision = revision + 100")
    raw.commit()
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.read(["a"])
    assert err.value.code == "decode_failed"
    raw.exec_driver_sql("UPDATE flows_run_changes SET revision = revision - 100")
    raw.commit()
    insert_run(raw, "b")
    raw.commit()
    assert [s.revision for s in store.feed.read(["a", "b"]).snapshots] == [1, 2]


@pytest.fixture
def unchecked(raw, backend):
    """Let raw SQL store rows the CHECK constraints would refuse (to prove reads fail closed)."""
    if backend == "sqlite":
        raw.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
    else:
        raw.exec_driver_sql(
            """DO $$ DECLARE r record; BEGIN
                 FOR r IN SELECT conrelid::regclass AS tbl, conname FROM pg_constraint
                          WHERE contype = 'c' AND connamespace = current_schema()::regnamespace LOOP
                   EXECUTE format('ALTER TABLE %%s DROP CONSTRAINT %%I', r.tbl, r.conname);
                 END LOOP; END $$"""
        )
    raw.commit()
    return raw


ACK = '{"observedAtMs": 3, "owner": {"hostId": "h", "pid": 1, "nonce": "n"}}'
CORRUPTIONS = {
    "status unknown": ("update", {"status": "unknown"}),
    "running without owner": ("update", {"status": "running"}),
    "owner on pending row": ("update", {"owner_host_id": "h", "owner_pid": 1, "owner_nonce": "n"}),
    "heartbeat on pending row": ("update", {"heartbeat_at_ms": 1}),
    "empty waiting reason": ("update", {"waiting_reason": ""}),
    "wake without reason": ("update", {"waiting_wake_at_ms": 5}),
    "token without reason": ("update", {"waiting_token": "t"}),
    "request without reason": ("update", {"waiting_request": "{}"}),
    "request not json": ("update", {"waiting_reason": "approval", "waiting_request": "not-json"}),
    "parent is self": ("update", {"parent_run_id": "victim"}),
    "lineage without round": ("update", {"lineage_id": "l"}),
    "round without lineage": ("update", {"round_ordinal": 1}),
    "ack without request": ("update", {"cancel_acknowledgement_json": ACK}),
    "ack of another shape": ("update", {"cancel_requested_at_ms": 1, "cancel_acknowledgement_json": '{"a": 1}'}),
    "state not json": ("update", {"state_json": "{"}),
    "negative created": ("update", {"created_at_ms": -1}),
    "change revision 0": ("sql", "UPDATE flows_run_changes SET revision = 0 WHERE run_id = 'victim'"),
    "revision above watermark": ("sql", "UPDATE flows_run_source SET revision = 0"),
    "deleted flag on live row": ("sql", "UPDATE flows_run_changes SET deleted = 1 WHERE run_id = 'victim'"),
    "live run without change row": ("sql", "DELETE FROM flows_run_changes WHERE run_id = 'victim'"),
    "source bad": ("sql", "UPDATE flows_run_source SET source = 'bad'"),
    "live change row without run": ("sql", "INSERT INTO flows_run_changes VALUES ('ghost', 99, 0)"),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS), ids=list(CORRUPTIONS))
def test_corrupt_rows_fail_closed_as_decode_failed(store, unchecked, corruption, backend):
    """ES-10: each corruption of a stored row or position makes the read fail with decode_failed."""
    kind, what = CORRUPTIONS[corruption]
    insert_run(unchecked, "victim")
    unchecked.commit()
    if corruption == "live change row without run":
        unchecked.exec_driver_sql("UPDATE flows_run_source SET revision = 200")
    if corruption == "negative created" and backend == "sqlite":
        unchecked.exec_driver_sql("DROP TRIGGER flows_runs_creation_immutable")
    if corruption == "negative created" and backend == "postgresql":
        unchecked.exec_driver_sql("DROP TRIGGER flows_runs_identity_immutable ON flows_runs")
    if kind == "update":
        update_run(unchecked, "victim", **what)
    else:
        unchecked.exec_driver_sql(what)
    unchecked.commit()
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.read(["victim", "ghost"])
    assert err.value.code == "decode_failed"
    assert "victim" not in str(err.value)


@pytest.mark.parametrize(
    "bad",
    ["", "nul\x00", "lone\ud800", "x" * 1025, "\U0001f600" * 513, 7, None, b"bytes"],
    ids=["empty", "nul", "surrogate", "1025", "astral-1026-units", "int", "none", "bytes"],
)
def test_bad_requested_ids_are_decode_failed(store, bad):
    """ES-11: NUL, a lone surrogate or more than 1 024 UTF-16 units (and non-text) are refused."""
    with pytest.raises(fencepost.RunStoreError) as err:
        store.feed.read(["ok", bad])
    assert err.value.code == "decode_failed"
    assert "run_ids[1]" in str(err.value)


def test_ids_of_1023_and_1024_units_are_missing(store):
    """ES-11: the identifier bound is inclusive."""
    batch = store.feed.read(["x" * 1023, "x" * 1024, "\U0001f600" * 512])
    assert [type(s) for s in batch.snapshots] == [Missing, Missing, Missing]


def test_a_non_sequence_request_is_refused(store):
    for bad in ("abc", {"a"}, None, 5):
        with pytest.raises(fencepost.RunStoreError) as err:
            store.feed.read(bad)  # type: ignore[arg-type]
        assert err.value.code == "decode_failed"


def test_long_waiting_token_is_only_ever_a_digest(store, raw):
    """EC-02: reason 'reason'x300 and token 'token'x500 reopened: waiting other, digest, no raw token."""
    token = "token" * 500
    _suspend(raw, "parked", "reason" * 300, token=token, wake=None)
    raw.commit()
    with fencepost.open(store.url, clock=store.clock) as again:
        snap = again.feed.read(["parked"]).snapshots[0]
    assert snap.waiting == Waiting("other", "reason" * 300, None, hashlib.sha256(token.encode()).hexdigest(), None)
    assert token.encode() not in msgspec.json.encode(snap)


def test_read_snapshot_isolation_holds_within_one_read(store, raw):
    """EI-01: inside one read, a peer's committed insert stays invisible; the next read sees it."""
    insert_run(raw, "a")
    raw.commit()
    count = text("SELECT count(*) FROM flows_runs")

    def body(conn):
        before = conn.execute(count).scalar()
        insert_run(raw, "b")
        raw.commit()
        return before, conn.execute(count).scalar()

    assert store.db.read(body) == (1, 1)
    assert store.db.read(lambda conn: conn.execute(count).scalar()) == 2


# ---------------------------------------------------------------- C2: coherence of an answer
SRC = "a" * 32


def _obs(run_id, revision, source=SRC):
    return Observed(run_id, source, revision, "pending", None, 0, None, None, None, run_id, 0, None, None, None)


def test_coherent_batches_pass_the_check():
    """EB-01: order and duplicates kept. EB-02: an empty batch at revision 0. EB-03: a row at the
    watermark and a Missing at revision 0. EB-04: a MAX_SAFE watermark and row revision."""
    check_batch(["m", "p", "p", "d", "m"], Batch(SRC, 5, [
        Missing("m", SRC, 5, False), _obs("p", 3), _obs("p", 3), Missing("d", SRC, 4, True),
        Missing("m", SRC, 5, False),
    ]))
    check_batch([], Batch(SRC, 0, []))
    check_batch(["r", "x"], Batch(SRC, 3, [_obs("r", 3), Missing("x", SRC, 0, True)]))
    big = 2**53 - 1
    check_batch(["r"], Batch(SRC, big, [_obs("r", big)]))


INCOHERENT = {
    "source empty": (["r"], Batch("", 3, [_obs("r", 1, "")])),
    "source 31 hex": (["r"], Batch("a" * 31, 3, [_obs("r", 1, "a" * 31)])),
    "source 33 hex": (["r"], Batch("a" * 33, 3, [_obs("r", 1, "a" * 33)])),
    "source g": (["r"], Batch("g" * 32, 3, [_obs("r", 1, "g" * 32)])),
    "source upper": (["r"], Batch("A" * 32, 3, [_obs("r", 1, "A" * 32)])),
    "fewer rows": (["r", "s"], Batch(SRC, 3, [_obs("r", 1)])),
    "more rows": (["r"], Batch(SRC, 3, [_obs("r", 1), _obs("s", 2)])),
    "rows for empty request": ([], Batch(SRC, 3, [_obs("r", 1)])),
    "wrong order": (["r", "s"], Batch(SRC, 3, [_obs("s", 2), _obs("r", 1)])),
    "unrelated id": (["r"], Batch(SRC, 3, [_obs("q", 1)])),
    "row of another source": (["r"], Batch(SRC, 3, [_obs("r", 1, "b" * 32)])),
    "row source malformed": (["r"], Batch(SRC, 3, [_obs("r", 1, "bad")])),
    "revision -1": (["r"], Batch(SRC, 3, [_obs("r", -1)])),
    "revision 0.5": (["r"], Batch(SRC, 3, [_obs("r", 0.5)])),
    "revision 2^53": (["r"], Batch(SRC, 2**53 - 1, [_obs("r", 2**53)])),
    "revision nan": (["r"], Batch(SRC, 3, [_obs("r", float("nan"))])),
    "revision inf": (["r"], Batch(SRC, 3, [_obs("r", float("inf"))])),
    "revision true": (["r"], Batch(SRC, 3, [_obs("r", True)])),
    "row newer than watermark": (["r"], Batch(SRC, 3, [_obs("r", 4)])),
    "batch revision invalid": (["r"], Batch(SRC, -1, [_obs("r", 1)])),
}


@pytest.mark.parametrize("case", list(INCOHERENT), ids=list(INCOHERENT))
def test_incoherent_batches_are_refused(case):
    """EB-05: every incoherence of an answer is refused by the check read() runs before answering."""
    run_ids, batch = INCOHERENT[case]
    with pytest.raises(Corrupt):
        check_batch(run_ids, batch)


def test_tombstone_read_after_delete(store, raw):
    insert_run(raw, "a")
    raw.commit()
    delete_run(raw, "a")
    raw.commit()
    batch = store.feed.read(["a"])
    assert batch.snapshots == [Missing("a", batch.source, 2, True)]


def test_run_store_lifecycle_is_observed_through_the_feed(store, origin):
    """ES-07 through the run store itself: claim_and_own at 1, request_cancel at 2, acknowledge at 3,
    cancel: the feed shows each step at a higher revision and the acknowledgement as written."""
    pending = fencepost.RunSnapshot("pending", None, None)
    store.runs.create("a", '{"flowName": "f"}')
    store.clock.set(1)
    store.runs.claim_and_own("a", pending, OWNER, 1)
    running = store.feed.read(["a"]).snapshots[0]
    assert running.status == "running" and running.owner == OWNER and running.cancellation is None
    store.clock.set(2)
    store.runs.request_cancel("a", 2)
    requested = store.feed.read(["a"]).snapshots[0]
    assert requested.cancellation == Cancellation(2, None) and fencepost.is_newer(requested, running)
    store.clock.set(3)
    assert store.runs.acknowledge_cancel("a", OWNER, 3) is True
    store.runs.transition_owned("a", OWNER, "cancelled")
    done = store.feed.read(["a"]).snapshots[0]
    assert done.status == "cancelled" and done.owner is None
    assert done.cancellation == Cancellation(2, Acknowledgement(3, OWNER))
    changes = store.feed.changes_since(origin).changes
    assert [c.run_id for c in changes] == ["a"] and changes[0].revision == done.revision


def test_database_failures_are_persistence_failed_and_leave_the_store_usable(store, raw):
    """ES-09 / RL-05 (failure half): a real database failure (the change table is missing) surfaces as
    persistence_failed (list_runs: list_failed) without the driver's text, and once the table is back
    every call works again: no transaction or connection was leaked."""
    insert_run(raw, "a")
    raw.commit()
    origin = Position(store.feed.position().source, 0)
    raw.exec_driver_sql("ALTER TABLE flows_run_changes RENAME TO flows_run_changes_away")
    raw.commit()
    try:
        for call in (lambda: store.feed.read(["a"]), lambda: store.feed.changes_since(origin)):
            with pytest.raises(fencepost.RunStoreError) as err:
                call()
            assert err.value.code == "persistence_failed"
            assert "flows_run_changes" not in str(err.value)
        with pytest.raises(fencepost.RunStoreError) as err:
            store.feed.list_runs()
        assert err.value.code == "list_failed"
    finally:
        raw.exec_driver_sql("ALTER TABLE flows_run_changes_away RENAME TO flows_run_changes")
        raw.commit()
    assert store.feed.read(["a"]).snapshots[0].revision == 1
    assert [c.run_id for c in store.feed.changes_since(origin).changes] == ["a"]
    assert [r.run_id for r in store.feed.list_runs().runs] == ["a"]
