"""Migrations 4002 and 4003: ``founded_at_ms`` on a shard membership record, set on records written
before it existed; a store at 4001 still opens read-only."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError

import fencepost
from fencepost._migrations import migrate
from fencepost.errors import OpenError
from fencepost.shards import membership as ms
from tests.conftest import back_to_4001, ledger_of

MEMBER = ms.Membership("a" * 32, "shard-0", ("shard-0", "shard-1"), 1)


def test_4002_adds_founded_at_ms_and_4003_marks_a_record_left_at_4001(db_url: str) -> None:
    """4002 adds the column; 4003 marks a record written before the mark existed founded, at the
    time it was written (such a set was founded by a version that did not mark; until then a blank
    store opened in its place was adopted)."""
    with fencepost.open(db_url) as store:
        ms._record(store, MEMBER)
    back_to_4001(db_url)
    with fencepost.open(db_url) as store:
        assert store.migrations_applied == (4002, 4003, 4004)
        assert ms.read(store) == MEMBER
        assert store.db.read(lambda conn: conn.exec_driver_sql(
            "SELECT founded_at_ms = joined_at_ms FROM flows_shard_membership").scalar())
    assert migrate(fencepost.open(db_url).db) == []


def test_4003_marks_nothing_on_a_store_without_a_record(db_url: str) -> None:
    """A store of no set stays one; a founding made after 4003 is marked by its own open only."""
    fencepost.open(db_url).close()
    back_to_4001(db_url)
    with fencepost.open(db_url) as store:
        assert store.migrations_applied == (4002, 4003, 4004)
        assert ms.read(store) is None
        ms._record(store, MEMBER)
        assert ms.read_founded(store) is None


@pytest.mark.parametrize("value", ["-1", "9007199254740992", "'soon'"])
def test_founded_at_ms_is_a_checked_time(store: fencepost.Store, raw, value: str) -> None:
    ms._record(store, MEMBER)
    with pytest.raises(DBAPIError):
        raw.exec_driver_sql(f"UPDATE flows_shard_membership SET founded_at_ms = {value}")
    raw.rollback()
    raw.exec_driver_sql("UPDATE flows_shard_membership SET founded_at_ms = 0")
    raw.commit()


def test_a_store_at_4001_opens_read_only_without_being_migrated(db_url: str) -> None:
    """4002 is the one migration a read-only open reads around: a store the previous version left
    opens read-only, its record reads as before, and nothing migrates it."""
    with fencepost.open(db_url) as store:
        ms._record(store, MEMBER)
        store.runs.create("r-1", "{}")
    back_to_4001(db_url)
    with fencepost.open(db_url, readonly=True) as store:
        assert ms.read(store) == MEMBER
        assert store.runs.get("r-1").run_id == "r-1"
    assert 4002 not in ledger_of(db_url)


def test_a_store_missing_another_migration_still_needs_migrations_read_only(db_url: str) -> None:
    fencepost.open(db_url).close()
    back_to_4001(db_url)
    from fencepost._durable import Database

    db = Database(db_url)
    db.write(lambda conn: conn.exec_driver_sql("DELETE FROM flows_migrations WHERE migration_id = 1006"))
    db.dispose()
    with pytest.raises(OpenError) as err:
        fencepost.open(db_url, readonly=True)
    assert err.value.code == "needs_migrations"
