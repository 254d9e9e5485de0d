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


def test_a_shared_commit_on_a_full_disk_fails_every_member_then_the_group_writes_again(small_disk) -> None:
    """Covers full disk x group commit (nothing else did): four calls provably share one COMMIT
    (the leader holds its group open until the others are queued), and the disk is full when it
    runs. Every member gets ``SQLITE_FULL`` (a definite refusal, not "may have committed"), nothing
    of any member landed, no change reached the feed, and the same store's next shared group commits."""
    from sqlalchemy import event, text

    from fencepost._durable import COMMIT_UNKNOWN, DbFailure
    from tests.test_group_commit import _call_all, _hold_until_queued, _run_ids

    def insert(run_id: str):
        return lambda conn: conn.execute(text(
            "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES (:r, 'pending', :s, 0)"),
            {"r": run_id, "s": BIG_STATE})

    store = fencepost.open(small_disk.url())
    try:
        store.runs.create("before", "{}")
        since = store.feed.position()
        commits: list[int] = []
        event.listen(store.db.engine, "commit", lambda _conn: commits.append(1))
        small_disk.fill(store)

        def leader(conn):
            insert("leader-big")(conn)
            return _hold_until_queued(store, 3)(conn)

        outcomes = _call_all(store, leader, {f"m{i}": insert(f"m{i}") for i in range(3)})
        assert set(outcomes) == {"leader", "m0", "m1", "m2"}
        for name, outcome in outcomes.items():
            assert isinstance(outcome, DbFailure), (name, outcome)
            assert outcome.code == "SQLITE_FULL" and outcome.reason != COMMIT_UNKNOWN, (name, outcome)
        if small_disk.mounted:
            assert len(commits) == 1  # one shared COMMIT, refused (the page cap fails the INSERTs instead)
        assert _run_ids(store) == {"before"}
        assert store.feed.changes_since(since, limit=100).changes == []

        small_disk.free()
        outcomes = _call_all(store, _hold_until_queued(store, 3), {f"n{i}": insert(f"n{i}") for i in range(3)})
        assert not [o for o in outcomes.values() if isinstance(o, BaseException)], outcomes
        assert _run_ids(store) == {"before", "leader", "n0", "n1", "n2"}
    finally:
        small_disk.free()
        store.close()
