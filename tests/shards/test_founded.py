"""A finished founding is recorded in every member (``founded_at_ms``, migration 4002).

Whether a store that records no set may join one was decided by emptiness alone: a blank store given
beside a founded set that held no run yet was taken for the unfinished end of a founding and
recorded as a member another store already was. The open that completes a founding now marks every
member founded, and a blank store beside a founded member is refused.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost._durable import Database
from fencepost.clock import ManualClock
from fencepost.shards import ShardError
from fencepost.shards import membership as ms
from tests.conftest import back_to_4001, back_to_4002_unmarked, ledger_of, store_exists


def _founded_at(url: str) -> int | None:
    db = Database(url, readonly=True)
    try:
        return db.read(lambda conn: conn.exec_driver_sql("SELECT founded_at_ms FROM flows_shard_membership").scalar())
    finally:
        db.dispose()


def _joined_at(url: str) -> int:
    db = Database(url, readonly=True)
    try:
        return db.read(lambda conn: conn.exec_driver_sql("SELECT joined_at_ms FROM flows_shard_membership").scalar())
    finally:
        db.dispose()


def _state(url: str) -> tuple:
    """Everything a refused open could have written to a store: ledger, record, runs, journal, revision."""
    db = Database(url, readonly=True)
    try:
        def body(conn):
            q = conn.exec_driver_sql
            return (sorted(int(r[0]) for r in q("SELECT migration_id FROM flows_migrations")),
                    [tuple(r) for r in q("SELECT * FROM flows_shard_membership")],
                    q("SELECT count(*) FROM flows_runs").scalar(),
                    q("SELECT count(*) FROM flows_journal_events").scalar(),
                    [tuple(r) for r in q("SELECT source, revision FROM flows_run_source")])
        return db.read(body)
    finally:
        db.dispose()


def _refused(urls, match: str, **kw) -> ShardError:
    with pytest.raises(ShardError) as err:
        fencepost.open_shards(urls, **kw)
    assert err.value.code == "membership_mismatch"
    assert match in str(err.value)
    return err.value


@pytest.mark.parametrize("blank_at", ["current", "4001"])
def test_a_founded_set_never_adopts_a_blank_store_in_place_of_a_member(shard_urls, blank_at: str) -> None:
    """A set founded on [a, b] and holding no run yet, opened as [a, blank] (a migrated, empty store
    that records no set): the blank store was taken for the unfinished end of a founding and
    recorded as shard-1 of the set, so two stores recorded the same member and runs created
    through [a, b] and through [a, blank] went to different stores. Now refused, naming the
    position, and nothing is written to the blank store (one left by the previous version is not
    even migrated)."""
    a, b, blank, c = shard_urls(4)
    fencepost.open_shards([a, b]).close()
    fencepost.open(blank).close()
    if blank_at == "4001":
        back_to_4001(blank)
    before = [_state(u) for u in (a, b, blank)]
    err = _refused([a, blank], "shard #1 is not a member")
    assert blank.split("?")[0] not in str(err) and "shard-1" not in str(err)
    _refused([a, blank, c], "shard #1 is not a member", grow=True)  # a grow adds no stand-in either
    assert [_state(u) for u in (a, b, blank)] == before
    assert not store_exists(c)
    with fencepost.open_shards([a, b]) as shards:
        assert shards.names == ("shard-0", "shard-1")


def test_the_open_that_founds_a_set_marks_every_member_founded(shard_urls) -> None:
    """Founding records every member, then marks each founded in the same open; a grow marks the
    store it adds."""
    a, b, c = shard_urls(3)
    with fencepost.open_shards([a, b], clock=ManualClock(5_000)):
        pass
    assert [_founded_at(u) for u in (a, b)] == [5_000, 5_000]
    with fencepost.open_shards([a, b], clock=ManualClock(9_000)):
        pass
    assert [_founded_at(u) for u in (a, b)] == [5_000, 5_000]  # marked once, never rewritten
    with fencepost.open_shards([a, b, c], grow=True, clock=ManualClock(7_000)):
        pass
    assert [_founded_at(u) for u in (a, b, c)] == [5_000, 5_000, 7_000]


def test_an_unfinished_founding_is_marked_only_by_the_open_that_finishes_it(shard_urls) -> None:
    """The founder recorded the first store and died: nothing is marked founded, so the next open
    still finishes the founding (adopting the empty stores), and marks every member then."""
    urls = shard_urls(3)
    for url in urls:
        fencepost.open(url).close()
    with fencepost.open(urls[0]) as s0:
        ms._record(s0, ms.Membership("f" * 32, "shard-0", ("shard-0", "shard-1", "shard-2"), 1), expected=None)
    assert _founded_at(urls[0]) is None
    with fencepost.open_shards(urls, clock=ManualClock(3_000)) as shards:
        assert shards.membership.set_id == "f" * 32
    assert [_founded_at(u) for u in urls] == [3_000] * 3


def test_a_set_founded_before_migration_4002_opens_read_only_and_is_marked_when_migrated(
        shard_urls) -> None:
    """Stores of a set founded by the previous version (at migration 4001) open read-only as they
    are, migrated by nothing; a writable open migrates them, and migration 4003 marks each record
    founded at the time it was written (it used to wait for the next open of the whole set, and a
    blank store opened in place of a member before that was adopted); from then on a blank store
    in place of a member is refused."""
    a, b, blank = shard_urls(3)
    fencepost.open_shards([a, b]).close()
    back_to_4001(a)
    back_to_4001(b)
    with fencepost.open(a, readonly=True) as store:
        assert ms.read(store).shard_name == "shard-0"
    with fencepost.open_shards([a, b], readonly=True) as shards:
        assert shards.names == ("shard-0", "shard-1")
    assert 4002 not in ledger_of(a) | ledger_of(b)
    _refused([a], "a shard is missing")  # a partial set marks nothing and migrates nothing
    assert 4002 not in ledger_of(a)
    with fencepost.open_shards([a, b], clock=ManualClock(8_000)):
        pass
    assert [_founded_at(u) for u in (a, b)] == [_joined_at(u) for u in (a, b)]
    fencepost.open(blank).close()
    _refused([a, blank], "shard #1 is not a member")
    assert ms.read(fencepost.open(blank)) is None


@pytest.mark.parametrize("where", ["look", "open"])
def test_a_member_read_unrecorded_just_before_a_concurrent_founding_finished_is_joined(
        shard_urls, monkeypatch, where: str) -> None:
    """Another opener may record a store and mark the set founded between this opener's read of
    that store (no record yet) and its read of a later member (founded): the stale "no record"
    beside a founded member is no stand-in. A member is recorded before any member is marked
    founded, so the store is read again, found recorded, and the set opens."""
    a, b, c = shard_urls(3)
    fencepost.open_shards([a, b, c]).close()
    stale = {b}
    if where == "look":
        real_look = ms._look_record

        def look_stale_once(db, conn):
            if db.url in stale:
                stale.discard(db.url)
                return None
            return real_look(db, conn)

        monkeypatch.setattr(ms, "_look_record", look_stale_once)
    else:
        real_read = ms.read

        def read_stale_once(store):
            if store.url in stale:
                stale.discard(store.url)
                return None
            return real_read(store)

        monkeypatch.setattr(ms, "read", read_stale_once)
    with fencepost.open_shards([a, b, c]) as shards:
        assert shards.names == ("shard-0", "shard-1", "shard-2")
    assert not stale  # the stale read did happen


@pytest.mark.parametrize("left", ["4001", "4001-then-plain-open", "4002-unmarked"])
def test_a_set_founded_before_the_mark_never_adopts_a_blank_store_before_its_first_whole_open(
        shard_urls, left: str) -> None:
    """A carried finding: a set founded by a version that did not mark finished foundings, holding
    no run yet, opened writable as [a, blank] before any open of the whole set: with nothing marked
    and every store empty, the blank store was taken for the unfinished end of a founding and
    recorded as shard-1, a member b already was (runs then split between b and blank). A record
    written before the mark existed is now taken as founded: refused, nothing written to the blank
    store, and the real set still opens. ``4001-then-plain-open``: a plain open migrated a alone
    first; ``4002-unmarked``: a store left by the version that added the mark but never opened
    whole since it was migrated."""
    a, b, blank = shard_urls(3)
    fencepost.open_shards([a, b]).close()
    for url in (a, b):
        back_to_4001(url) if left != "4002-unmarked" else back_to_4002_unmarked(url)
    if left == "4001-then-plain-open":
        fencepost.open(a).close()
    fencepost.open(blank).close()
    before = _state(blank)
    _refused([a, blank], "shard #1 is not a member")
    assert _state(blank) == before
    with fencepost.open(blank) as store:
        assert ms.read(store) is None
    with fencepost.open_shards([a, b]) as shards:
        assert shards.names == ("shard-0", "shard-1")
