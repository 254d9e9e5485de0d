"""Migration 4004: a shard membership record's ``generation`` and ``joined_at_ms`` bounded to 2^53 - 1
in the database, as every other integer of a store is (``test_safe_integers`` now covers them too).

A store the version before 4004 left (its ledger up to 4003, built by that version's migrations)
still opens read-only, as it is; a writable open applies 4004. A stamp past the bound, which a
clock reading past it could write while a set was founded, becomes the bound; a generation past it
(only a hand edit puts one there) fails the migration, which changes nothing. Both backends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import fencepost
from fencepost import _migrations
from fencepost._durable import Database, DbFailure
from fencepost.shards import membership as ms
from tests.conftest import back_to_4003, ledger_of

MEMBER = ms.Membership("a" * 32, "shard-0", ("shard-0", "shard-1"), 3)
SAFE = 2**53 - 1


@contextmanager
def _before_4004() -> Iterator[None]:
    """Opens in this block migrate as the version before 4004 did (every migration but 4004)."""
    shipped = _migrations.discover
    patch = pytest.MonkeyPatch()
    patch.setattr(_migrations, "discover", lambda *a, **k: [m for m in shipped(*a, **k) if m.id != 4004])
    try:
        yield
    finally:
        patch.undo()


def _old_store(url: str, *, generation: int = 3, joined_at_ms: int = 1_000) -> None:
    """A store as the version before 4004 left it: a run, and a membership record with these values."""
    with _before_4004(), fencepost.open(url) as store:
        ms._record(store, MEMBER)
        store.runs.create("r-1", "{}")
        store.db.write(lambda conn: conn.exec_driver_sql(
            f"UPDATE flows_shard_membership SET generation = {generation}, joined_at_ms = {joined_at_ms}"))
    assert 4003 in ledger_of(url) and 4004 not in ledger_of(url)


def _record_row(url: str) -> tuple:
    db = Database(url, readonly=True)
    try:
        return tuple(db.read(lambda conn: conn.exec_driver_sql(
            "SELECT set_id, shard_name, members_json, generation, joined_at_ms, founded_at_ms "
            "FROM flows_shard_membership").one()))
    finally:
        db.dispose()


def _refuses(url: str, column: str) -> bool:
    """Whether the database refuses ``column`` = 2^53 on the record (a CHECK; the change is rolled back)."""
    db = Database(url)
    try:
        db.write(lambda conn: conn.exec_driver_sql(f"UPDATE flows_shard_membership SET {column} = {2**53}"))
    except DbFailure as exc:
        assert exc.category == "constraint", exc
        return True
    finally:
        db.dispose()
    return False


def test_a_store_before_4004_opens_read_only_as_it_is_and_a_writable_open_applies_4004(db_url: str) -> None:
    _old_store(db_url)
    before = _record_row(db_url)
    assert _refuses(db_url, "generation") is False  # the old table takes it (undone below)
    Database(db_url).write(lambda conn: conn.exec_driver_sql("UPDATE flows_shard_membership SET generation = 3"))
    with fencepost.open(db_url, readonly=True) as store:
        assert ms.read(store) == MEMBER and ms.read_founded(store) is None
        assert store.runs.get("r-1").run_id == "r-1"
    assert 4004 not in ledger_of(db_url) and _record_row(db_url) == before
    with fencepost.open(db_url) as store:
        assert store.migrations_applied == (4004,)
        assert ms.read(store) == MEMBER and store.runs.get("r-1").run_id == "r-1"
    assert _record_row(db_url) == before
    assert _refuses(db_url, "generation") and _refuses(db_url, "joined_at_ms")
    assert _record_row(db_url) == before


def test_4004_brings_a_stamp_past_the_bound_to_the_bound(db_url: str) -> None:
    """A founding whose clock read past 2^53 - 1 wrote such a ``joined_at_ms`` (nothing reads it back)."""
    _old_store(db_url, joined_at_ms=2**53 + 7)
    with fencepost.open(db_url) as store:
        assert store.migrations_applied == (4004,)
        assert ms.read(store) == MEMBER
    assert _record_row(db_url)[3:5] == (3, SAFE)


def test_4004_refuses_a_generation_past_the_bound_and_changes_nothing(db_url: str) -> None:
    """Only a hand edit puts a generation there (a set grows by one at a time): the writable open
    fails, naming the migration (not the value), and leaves the store as it was, still readable
    read-only. Before, the message said only that the store could not be opened."""
    _old_store(db_url, generation=2**53)
    before = _record_row(db_url)
    with pytest.raises(fencepost.OpenError) as err:
        fencepost.open(db_url)
    assert err.value.code == "open_failed" and str(err.value).endswith(
        "could not be opened; migration 4004 (shards_safe_integers) could not be applied: a row breaks a "
        "constraint; no migration was applied"), err.value
    assert str(2**53) not in str(err.value)
    assert 4004 not in ledger_of(db_url) and _record_row(db_url) == before
    with fencepost.open(db_url, readonly=True) as store:
        assert store.runs.get("r-1").run_id == "r-1"


def test_a_set_whose_stores_lack_4004_opens_read_only_and_a_writable_open_migrates_each(make_db_url) -> None:
    """The read path of a set (every store's record, then routed reads) needs nothing 4004 adds: a
    set the previous version left opens read-only as it is; the writable open applies 4004 to each."""
    urls = [make_db_url(), make_db_url()]
    with fencepost.open_shards(urls) as shards:
        shards.runs.create("r-1", "{}")
        home = shards.locate("r-1")
    for url in urls:
        back_to_4003(url)
        assert 4004 not in ledger_of(url)
    with fencepost.open_shards(urls, readonly=True) as shards:
        assert shards.names == ("shard-0", "shard-1") and shards.runs.get("r-1").status == "pending"
        assert shards.locate("r-1") == home
    assert all(4004 not in ledger_of(url) for url in urls)
    with fencepost.open_shards(urls) as shards:
        assert shards.runs.get("r-1").status == "pending"
    assert all(4004 in ledger_of(url) for url in urls)
    assert all(_refuses(url, "joined_at_ms") for url in urls)
