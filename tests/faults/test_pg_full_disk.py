"""A full disk under a PostgreSQL server (a private ``initdb`` instance whose default tablespace, so
every table and index of fencepost's schema, lives on a small tmpfs; the shared server is never
touched). Each test's docstring names its pair.

The server's log (``pg_wal``) stays on the ordinary disk: a table that cannot grow is refused with
SQLSTATE 53100 (``disk_full``) and the server runs on. What the caller sees is the store's error for
the call (``persistence_failed`` / ``sink_failed``, ``db_code`` 53100, "the disk is full"; an open
says ``disk_full``), nothing of the failed call lands, and once space is back the SAME object writes
again. A write that fits in pages the tables already have is no failure: PostgreSQL needs new room
only to grow a file, so every write below grows one (a state or payload of incompressible bytes, or
a first row in an empty table).
"""

from __future__ import annotations

import secrets
import time

import pytest
from sqlalchemy import text

import fencepost
from fencepost.journal import OwnerId, verify
from tests.faults.conftest import assert_value_free, record

pytestmark = pytest.mark.slow

A = OwnerId("host-a", 101, "owner-a")
DISK_FULL = "the disk is full"


def _big() -> str:
    """A state that must grow the tables (hex of random bytes: the server's compression keeps half)."""
    return '{"blob": "' + secrets.token_hex(200_000) + '"}'


def _state(store: fencepost.Store) -> tuple:
    """Everything a write could have touched: the runs, the leases, the journal and the feed's head."""
    def read(conn):
        runs = [tuple(r) for r in conn.execute(text(
            "SELECT run_id, status, owner_nonce, state_json FROM flows_runs ORDER BY run_id")).all()]
        leases = [tuple(r) for r in conn.execute(text(
            "SELECT run_id, owner_nonce, claim_nonce FROM flows_consensus_leases ORDER BY run_id")).all()]
        entries = conn.execute(text("SELECT count(*) FROM flows_journal_events")).scalar()
        return runs, leases, entries

    return (*store.db.read(read), store.feed.position())


def _assert_disk_full(exc: BaseException, code: str) -> None:
    assert (exc.code, getattr(exc, "db_code", None)) == (code, "53100"), exc  # type: ignore[attr-defined]
    assert DISK_FULL in str(exc), exc
    assert getattr(exc, "transient", None) is False, exc
    assert_value_free(exc)


def test_run_store_writes_on_a_full_disk_fail_cleanly_then_the_same_store_writes(full_disk_server) -> None:
    """PostgreSQL full disk x run-store writes (create, claim, settle). Each is refused with
    ``persistence_failed`` / 53100 saying the disk is full, the store is exactly as it was before
    the call, and once space is back the same store does each of them."""
    store = fencepost.open(full_disk_server.url)
    try:
        store.runs.create("queued", "{}")
        store.runs.create("owned", "{}")
        now = int(time.time() * 1000)
        full_disk_server.fill()
        before = _state(store)
        with pytest.raises(fencepost.RunStoreError) as created:
            store.runs.create("doomed", _big())
        _assert_disk_full(created.value, "persistence_failed")
        assert _state(store) == before
        with pytest.raises(fencepost.RunStoreError) as claimed:  # the first lease row grows its table
            store.runs.claim_and_own("queued", store.runs.get("queued").snapshot(), A, now)
        _assert_disk_full(claimed.value, "persistence_failed")
        assert _state(store) == before
        full_disk_server.free()
        assert type(store.runs.claim_and_own("owned", store.runs.get("owned").snapshot(), A, now)).__name__ == \
            "Activated"

        full_disk_server.fill()
        before = _state(store)
        with pytest.raises(fencepost.RunStoreError) as settled:
            store.runs.transition_owned("owned", A, "completed", _big())
        _assert_disk_full(settled.value, "persistence_failed")
        assert _state(store) == before
        assert store.runs.get("owned").status == "running"

        full_disk_server.free()
        cleared = time.monotonic()
        store.runs.create("after", _big())
        assert type(store.runs.claim_and_own("queued", store.runs.get("queued").snapshot(), A, now)).__name__ == \
            "Activated"
        assert type(store.runs.transition_owned("owned", A, "completed", '{"done": true}')).__name__ == \
            "Transitioned"
        record("disk full (tablespace on tmpfs)", "postgresql", "RunStoreError persistence_failed 53100",
               time.monotonic() - cleared)
        assert [store.runs.get(r).status for r in ("after", "queued", "owned")] == ["pending", "running", "completed"]
        with pytest.raises(fencepost.RunStoreError) as missing:
            store.runs.get("doomed")
        assert missing.value.code == "not_found_row"
    finally:
        full_disk_server.free()
        store.close()


def test_journal_appends_alone_and_sharing_a_commit_on_a_full_disk(full_disk_server) -> None:
    """PostgreSQL full disk x journal append, alone and three appends sharing one group commit with
    the leader's own write. Every call fails ``sink_failed`` / 53100 (the leader's
    ``persistence_failed``), never "may have committed"; no entry, no run and no change landed; the
    journal verifies; once space is back the same store's next shared group commits and verifies."""
    from fencepost._durable import COMMIT_UNKNOWN
    from tests.faults.test_writer_full_disk import _shared
    from tests.test_group_commit import _hold_until_queued, _run_ids

    store = fencepost.open(full_disk_server.url)
    try:
        for n in range(3):
            store.journal.append_unfenced(f"stream-{n}", "made", {"n": 0}, source_id="fault-suite")
        head_before = verify(store).head
        full_disk_server.fill()
        before = _state(store)

        with pytest.raises(fencepost.JournalError) as alone:
            store.journal.append_unfenced("stream-0", "step", {"blob": secrets.token_hex(100_000)},
                                          source_id="fault-suite")
        _assert_disk_full(alone.value, "sink_failed")
        assert COMMIT_UNKNOWN not in str(alone.value)
        assert _state(store) == before

        def appends(tag: str) -> dict:
            return {f"{tag}{n}": (lambda n=n: store.journal.append_unfenced(
                f"stream-{n}", "step", {"blob": secrets.token_hex(100_000)}, source_id="fault-suite"))
                for n in range(3)}

        def leader(conn):  # a write of its own that needs room too, then holds the group open
            store.runs.create("leader-big", _big())
            return _hold_until_queued(store, 3)(conn)

        outcomes = _shared(store, leader, appends("a"))
        assert set(outcomes) == {"leader", "a0", "a1", "a2"}
        for name, outcome in outcomes.items():
            assert isinstance(outcome, fencepost.FencepostError), (name, outcome)
            _assert_disk_full(outcome, "persistence_failed" if name == "leader" else "sink_failed")
            assert COMMIT_UNKNOWN not in str(outcome), (name, outcome)
        assert _state(store) == before
        assert _run_ids(store) == set()
        report = verify(store)
        assert report.ok and report.head == head_before and report.entries_checked == 3, report

        full_disk_server.free()
        since = store.feed.position()
        outcomes = _shared(store, _hold_until_queued(store, 3), appends("b"))
        assert not [o for o in outcomes.values() if isinstance(o, BaseException)], outcomes
        report = verify(store)
        assert report.ok and report.entries_checked == 6, report
        changed = store.feed.changes_since(since, limit=100).changes
        assert [c.run_id for c in changed] == ["leader"]  # the feed goes on from where it was
    finally:
        full_disk_server.free()
        store.close()


def test_a_projection_page_on_a_full_postgresql_target_applies_nothing_then_the_same_builder_finishes(
        full_disk_server) -> None:
    """PostgreSQL full disk x projection page on a PostgreSQL target. The builder's first pages
    commit, then the target's disk fills: the catch-up fails ``persistence_failed`` / 53100 saying
    the disk is full, the checkpoint and the live rows are those of the last committed page, and once
    space is back the same builder finishes; its projection equals one built afresh."""
    from fencepost.projections import ProjectionBuilder, RunsByStatus

    url = full_disk_server.url
    target = url.replace("schema=fencepost", "schema=proj")
    fresh = url.replace("schema=fencepost", "schema=fresh")

    def rows(at: str) -> list[tuple]:
        with fencepost.open(url) as s:
            schema = at.rsplit("schema=", 1)[1]
            return s.db.read(lambda c: [tuple(r) for r in c.execute(text(
                f"SELECT run_id, status, source, revision FROM {schema}.projection_runs_by_status "
                "ORDER BY run_id")).all()])

    with fencepost.open(url) as store:
        # Flow names of incompressible bytes: each page must grow the projection's table.
        store.journal.transact(lambda tx: [store.runs.create(
            f"run-{i:03d}", '{"flowName": "' + secrets.token_hex(2000) + '"}') for i in range(120)])
        with ProjectionBuilder(store, target, RunsByStatus(), batch_size=30) as builder:
            pages: list[int] = []

            def fill_after_first(shadow: bool, page) -> None:
                pages.append(page.next_revision)
                if len(pages) == 1:
                    full_disk_server.fill()

            builder._after_page = fill_after_first
            try:
                with pytest.raises(fencepost.ProjectionError) as caught:
                    builder.catch_up()
            finally:
                builder._after_page = None
            _assert_disk_full(caught.value, "persistence_failed")
            assert len(pages) == 1
            assert builder.status().applied_revision == pages[0]  # the failed page moved nothing
            assert len(rows(target)) == 30
            full_disk_server.free()
            done = builder.catch_up()
            assert done.applied == 90 and builder.status().lag == 0, done
        with ProjectionBuilder(store, fresh, RunsByStatus()) as again:
            again.catch_up()
        assert rows(target) == rows(fresh)


def test_migrations_on_open_on_a_full_disk_say_disk_full_and_leave_nothing(full_disk_server) -> None:
    """PostgreSQL full disk x migration on open (a new schema). ``fencepost.open`` fails ``disk_full``
    ("no space left on the disk"), nothing of the migration pass landed (no table, no ledger), and once
    space is back a plain open migrates and writes."""
    from tests.conftest import ledger_of

    with fencepost.open(full_disk_server.url) as first:
        first.runs.create("elsewhere", "{}")
        want = ledger_of(full_disk_server.url)
    url = full_disk_server.url.replace("schema=fencepost", "schema=late")
    full_disk_server.fill()
    try:
        with pytest.raises(fencepost.OpenError) as caught:
            fencepost.open(url).close()
    finally:
        full_disk_server.free()
    assert (caught.value.code, getattr(caught.value, "db_code", None)) == ("disk_full", "53100"), caught.value
    assert "no space left on the disk" in str(caught.value)
    assert_value_free(caught.value)
    with fencepost.open(full_disk_server.url) as other:
        tables = other.db.read(lambda c: c.execute(text(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'late'")).scalar())
    assert tables == 0  # nothing of the migration pass landed
    with fencepost.open(url) as store:
        store.runs.create("after", "{}")
        assert store.runs.get("after").status == "pending"
    assert ledger_of(url) == want


def test_a_full_log_disk_panics_the_server_and_the_same_store_writes_once_it_is_back(wal_full_server) -> None:
    """PostgreSQL full disk under the server's log (``pg_wal``) x run-store write. PostgreSQL cannot
    refuse a COMMIT whose log record it cannot write: it PANICs (every session ends) and, with no
    room to recover in, shuts down. The caller's write fails ``persistence_failed`` / 53100 saying
    the disk is full and that the COMMIT's outcome is unknown (transient: the server is away);
    nothing partial landed (the run and its journal entry are both there or both absent), every
    write acknowledged before is there, and once space is back and the server started again the
    SAME store writes, the feed going on without a gap."""
    from fencepost._durable import COMMIT_UNKNOWN
    from tests.faults.conftest import _counts

    store = fencepost.open(wal_full_server.url)
    try:
        store.runs.create("before", "{}")
        since = store.feed.position()
        wal_full_server.fill()
        acknowledged: list[str] = []
        failed = None
        for i in range(200):  # the log's recycled segments take the first writes
            try:
                store.runs.create(f"big-{i:03d}", _big())
            except fencepost.RunStoreError as exc:
                failed = (f"big-{i:03d}", exc)
                break
            acknowledged.append(f"big-{i:03d}")
        assert failed is not None, "the log never filled"
        doomed, exc = failed
        assert (exc.code, getattr(exc, "db_code", None)) == ("persistence_failed", "53100"), exc
        assert DISK_FULL in str(exc) and COMMIT_UNKNOWN in str(exc), exc
        assert getattr(exc, "transient", None) is True, exc
        assert_value_free(exc)

        deadline = time.monotonic() + 30
        while wal_full_server.running():  # the PANIC, the failed recovery, the shutdown
            assert time.monotonic() < deadline, "the server did not stop"
            time.sleep(0.05)
        wal_full_server.free()
        wal_full_server.start()
        cleared = time.monotonic()
        store.runs.create("after", "{}")  # the same store, its dead connections replaced
        record("log disk full (pg_wal on tmpfs)", "postgresql",
               "RunStoreError persistence_failed 53100 (PANIC, COMMIT unknown)", time.monotonic() - cleared)

        assert _counts(store, doomed) in ((0, 0), (1, 1))  # all of it or nothing
        landed = [doomed] if _counts(store, doomed) == (1, 1) else []
        for run_id in acknowledged:
            assert store.runs.get(run_id).status == "pending"
        changed = [c.run_id for c in store.feed.changes_since(since, limit=1000).changes]
        assert changed == [*acknowledged, *landed, "after"], changed  # once each, in order, no gap
    finally:
        wal_full_server.free()
        store.close()
