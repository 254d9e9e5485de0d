"""A full disk under a SQLite store: SQLITE_FULL for the caller, nothing partial, then business as usual.

The disk is real: a small tmpfs filled with a ballast file (see ``small_disk`` in conftest.py;
where mounting is refused, ``fencepost.testing.limit_pages`` caps the database instead).
"""

from __future__ import annotations

import time

import pytest

import fencepost
from tests.faults.conftest import (
    BIG_STATE,
    RECOVERY_BOUND_S,
    assert_nothing_of,
    assert_once,
    assert_value_free,
    composite,
    record,
)

pytestmark = pytest.mark.slow


def test_full_disk_fails_the_commit_and_the_same_store_recovers(small_disk, peer) -> None:
    store = fencepost.open(small_disk.url())
    try:
        other = peer(small_disk.url())
        store.runs.create("before", "{}")
        since = store.feed.position()
        small_disk.fill(store)

        # On tmpfs the WAL cannot grow, so COMMIT fails (JournalError: the transaction is the
        # journal's); under the page cap the run's own INSERT fails first (RunStoreError).
        with pytest.raises((fencepost.JournalError, fencepost.RunStoreError)) as err:
            composite(store, "doomed", state=BIG_STATE)
        assert err.value.db_code == "SQLITE_FULL"  # type: ignore[attr-defined]
        assert err.value.code in ("sink_failed", "persistence_failed")
        assert_value_free(err.value)
        with pytest.raises(fencepost.RunStoreError) as err2:
            store.runs.create("doomed-2", BIG_STATE)
        assert (err2.value.code, err2.value.db_code) == ("persistence_failed", "SQLITE_FULL")  # type: ignore[attr-defined]
        # Reads still work on a full disk.
        assert store.runs.get("before").status == "pending"

        small_disk.free()
        cleared = time.monotonic()
        # No write lock left behind: another process writes at once...
        assert other.write(timeout=5) < RECOVERY_BOUND_S
        # ...and so does the same Store, on the same thread, without reopening.
        composite(store, "after")
        recovered = time.monotonic() - cleared
        assert_once(store, "after")
        record("disk full (tmpfs)" if small_disk.mounted else "disk full (page cap)", "sqlite",
               f"{type(err.value).__name__} {err.value.code} SQLITE_FULL", recovered)
        assert_nothing_of(store, "doomed", since)
        assert_nothing_of(store, "doomed-2", since)
        assert recovered < 5, recovered
    finally:
        small_disk.free()
        store.close()


def test_full_disk_in_every_thread_then_every_thread_writes_again(small_disk) -> None:
    """Each of four threads hits SQLITE_FULL on its own kept connection, then writes after space returns."""
    import threading

    store = fencepost.open(small_disk.url())
    try:
        small_disk.fill(store)
        failed = threading.Barrier(5)
        freed = threading.Event()
        errors: list[BaseException] = []
        codes: list[str | None] = []

        def work(n: int) -> None:
            try:
                try:
                    store.runs.create(f"full-{n}", BIG_STATE)
                except fencepost.RunStoreError as exc:
                    codes.append(exc.db_code)  # type: ignore[attr-defined]
                failed.wait(timeout=60)
                assert freed.wait(timeout=60)
                store.runs.create(f"ok-{n}", "{}")
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        failed.wait(timeout=60)
        small_disk.free()
        freed.set()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert codes == ["SQLITE_FULL"] * 4
        for n in range(4):
            assert store.runs.get(f"ok-{n}").status == "pending"
            with pytest.raises(fencepost.RunStoreError) as missing:
                store.runs.get(f"full-{n}")
            assert missing.value.code == "not_found_row"
    finally:
        small_disk.free()
        store.close()


def test_page_limit_hook_is_a_full_disk_too(tmp_path) -> None:
    """The fallback used where mounting is refused: the same SQLITE_FULL and the same recovery."""
    from fencepost.testing import limit_pages

    store = fencepost.open(f"sqlite:///{tmp_path / 'flows.db'}")
    try:
        store.runs.create("before", "{}")
        limit_pages(store, 0)
        with pytest.raises(fencepost.RunStoreError) as err:
            store.runs.create("doomed", BIG_STATE)
        assert (err.value.code, err.value.db_code) == ("persistence_failed", "SQLITE_FULL")  # type: ignore[attr-defined]
        limit_pages(store, None)
        store.runs.create("after", BIG_STATE)
        assert store.runs.get("after").status == "pending"
        with pytest.raises(fencepost.RunStoreError):
            store.runs.get("doomed")
    finally:
        store.close()


def _shared(store, leader_body, calls: dict) -> dict[str, object]:
    """Run ``leader_body`` as a write that holds its group open until every one of ``calls`` (name
    -> a no-argument store call, each on its own thread) has queued to join it; every outcome."""
    import threading

    outcomes: dict[str, object] = {}

    def call(name: str, fn) -> None:
        try:
            outcomes[name] = fn()
        except BaseException as exc:  # the caller's own outcome
            outcomes[name] = exc

    leader = threading.Thread(target=call, args=("leader", lambda: store.db.write(leader_body)))
    leader.start()
    deadline = time.monotonic() + 30
    while store.db._group._group is None:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    threads = [threading.Thread(target=call, args=item) for item in calls.items()]
    for t in threads:
        t.start()
    for t in [leader, *threads]:
        t.join(60)
    assert not any(t.is_alive() for t in [leader, *threads])
    return outcomes


def test_journal_appends_sharing_a_commit_on_a_full_disk_all_fail_then_the_group_writes_again(
        small_disk) -> None:
    """Covers full disk x journal appends gathered in one group commit (nothing else did): three
    appends to three streams and the leader's own write provably share one COMMIT (the leader holds
    its group open until they are queued), and the disk is full when it runs. Every call fails with
    ``SQLITE_FULL`` (a definite refusal, never "may have committed"), no entry and no change landed,
    the journal verifies, and the same store's next shared group commits and still verifies."""
    from sqlalchemy import event

    from fencepost._durable import COMMIT_UNKNOWN
    from fencepost.journal import verify
    from tests.test_group_commit import _hold_until_queued, _run_ids

    store = fencepost.open(small_disk.url())
    try:
        for n in range(3):
            store.journal.append_unfenced(f"stream-{n}", "made", {"n": 0}, source_id="fault-suite")
        head_before = verify(store).head
        since = store.feed.position()
        commits: list[int] = []
        event.listen(store.db.engine, "commit", lambda _conn: commits.append(1))
        small_disk.fill(store)

        def appends(tag: str) -> dict:
            return {f"{tag}{n}": (lambda n=n: store.journal.append_unfenced(
                f"stream-{n}", "step", {"blob": "x" * 65536}, source_id="fault-suite")) for n in range(3)}

        def leader(conn):  # a write of its own that needs room too, then holds the group open
            store.runs.create("leader-big", BIG_STATE)
            return _hold_until_queued(store, 3)(conn)

        outcomes = _shared(store, leader, appends("a"))
        assert set(outcomes) == {"leader", "a0", "a1", "a2"}
        for name, outcome in outcomes.items():
            assert isinstance(outcome, Exception), (name, outcome)
            assert (getattr(outcome, "db_code", None) or outcome.code) == "SQLITE_FULL", (name, outcome)
            assert COMMIT_UNKNOWN not in str(outcome), (name, outcome)
            if name != "leader":
                assert isinstance(outcome, fencepost.JournalError), (name, outcome)
                assert_value_free(outcome)
        if small_disk.mounted:
            assert len(commits) == 1  # one shared COMMIT, refused (the page cap fails the INSERTs instead)
        assert _run_ids(store) == set()
        report = verify(store)
        assert report.ok and report.head == head_before and report.entries_checked == 3, report
        assert store.feed.changes_since(since, limit=100).changes == []

        small_disk.free()
        outcomes = _shared(store, _hold_until_queued(store, 3), appends("b"))
        assert not [o for o in outcomes.values() if isinstance(o, BaseException)], outcomes
        report = verify(store)
        assert report.ok and report.entries_checked == 6, report
    finally:
        small_disk.free()
        store.close()
