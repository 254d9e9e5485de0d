"""A deferred constraint that fails at COMMIT: the caller gets the constraint, the store goes on.

The violation is only detected by COMMIT, after every statement of the transaction succeeded, so
this is the path where a failed commit used to leave SQLAlchemy's transaction (and, on SQLite, the
write lock) open for the life of the Store.
"""

from __future__ import annotations

import time

import pytest

import fencepost
from fencepost._durable import DbFailure
from tests.faults.conftest import (
    RECOVERY_BOUND_S,
    assert_nothing_of,
    assert_once,
    assert_value_free,
    composite,
    record,
)

pytestmark = pytest.mark.slow

FK_CODE = {"sqlite": "SQLITE_CONSTRAINT_FOREIGNKEY", "postgresql": "23503"}


def _deferred_fk(store: fencepost.Store) -> None:
    store.db.write(lambda c: c.exec_driver_sql("CREATE TABLE fault_parent (id INTEGER PRIMARY KEY)"))
    store.db.write(lambda c: c.exec_driver_sql(
        "CREATE TABLE fault_child (pid INTEGER REFERENCES fault_parent (id) DEFERRABLE INITIALLY DEFERRED)"))


def _violate(conn) -> None:
    conn.exec_driver_sql("INSERT INTO fault_child (pid) VALUES (-1)")


def test_deferred_fk_at_commit_through_db_write(db_url: str, backend: str, peer) -> None:
    """store.db.write: DbFailure(constraint, FK code); no lock held; the same thread writes again."""
    store = fencepost.open(db_url)
    try:
        _deferred_fk(store)
        other = peer(db_url)
        with pytest.raises(DbFailure) as err:
            store.db.write(_violate)
        assert (err.value.category, err.value.code) == ("constraint", FK_CODE[backend])
        assert_value_free(err.value)

        # Before the faulted store does anything else: another process can write at once.
        assert other.write(timeout=5) < RECOVERY_BOUND_S
        # And the same Store, on the same thread, works without reopening.
        store.db.write(lambda c: c.exec_driver_sql("INSERT INTO fault_parent (id) VALUES (1)"))
        store.db.write(lambda c: c.exec_driver_sql("INSERT INTO fault_child (pid) VALUES (1)"))
        rows = store.db.read(lambda c: c.exec_driver_sql("SELECT pid FROM fault_child").scalars().all())
        assert rows == [1]
    finally:
        store.close()


def test_deferred_fk_at_commit_through_the_store_api(db_url: str, backend: str, peer) -> None:
    """journal.transact with a run, an entry and a deferred violation: nothing of it lands."""
    store = fencepost.open(db_url)
    try:
        _deferred_fk(store)
        other = peer(db_url)
        since = store.feed.position()
        with pytest.raises(fencepost.JournalError) as err:
            composite(store, "doomed", _violate)
        # The journal reports every write failure as sink_failed, with the category and driver code.
        assert err.value.code == "sink_failed"
        assert err.value.cause_code == "constraint"  # type: ignore[attr-defined]
        assert err.value.db_code == FK_CODE[backend]  # type: ignore[attr-defined]
        assert_value_free(err.value)

        started = time.monotonic()
        assert other.write(timeout=5) < RECOVERY_BOUND_S
        assert_nothing_of(store, "doomed", since)
        # The same Store commits the same shape of transaction once the cause is gone.
        composite(store, "fine")
        record("deferred FK at COMMIT", backend, f"JournalError sink_failed/constraint {err.value.db_code}",
               time.monotonic() - started)
        assert_once(store, "fine")
        store.runs.create("after", "{}")
        assert store.runs.get("after").status == "pending"
    finally:
        store.close()


def test_every_thread_recovers_from_its_own_failed_commit(db_url: str, backend: str) -> None:
    """Four threads each hit a failed commit, then each writes again on its kept connection."""
    import threading

    store = fencepost.open(db_url)
    try:
        _deferred_fk(store)
        store.db.write(lambda c: c.exec_driver_sql("INSERT INTO fault_parent (id) VALUES (7)"))
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []
        seen: list[str | None] = []

        def work(n: int) -> None:
            try:
                barrier.wait()
                for _ in range(3):
                    try:
                        store.db.write(_violate)
                    except DbFailure as exc:
                        seen.append(exc.code)
                    store.db.write(lambda c: c.exec_driver_sql("INSERT INTO fault_child (pid) VALUES (7)"))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert seen == [FK_CODE[backend]] * 12
        count = store.db.read(lambda c: c.exec_driver_sql("SELECT count(*) FROM fault_child").scalar())
        assert count == 12
    finally:
        store.close()
