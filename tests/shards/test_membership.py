"""Shard membership: a misconfigured set is refused, naming the rule, and changes nothing."""

from __future__ import annotations

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.errors import FencepostError
from fencepost.shards import ShardError
from fencepost.shards import membership as ms
from tests.conftest import store_exists


def _records(urls: list[str]) -> list[object]:
    out = []
    for url in urls:
        with fencepost.open(url) as s:
            out.append(ms.read(s))
    return out


def _refused(urls, match: str, **kw) -> None:
    before = _records([u for u in (urls.values() if isinstance(urls, dict) else urls)])
    with pytest.raises(ShardError) as err:
        fencepost.open_shards(urls, **kw)
    assert err.value.code == "membership_mismatch"
    assert match in str(err.value)
    assert _records([u for u in (urls.values() if isinstance(urls, dict) else urls)]) == before


def _untouched(url: str) -> bool:
    """The store was never created: no SQLite file, no PostgreSQL schema."""
    return not store_exists(url)


def test_a_fresh_set_is_founded_and_reopens(shard_urls) -> None:
    urls = shard_urls(3)
    with fencepost.open_shards(urls, clock=ManualClock(0)) as shards:
        assert shards.names == ("shard-0", "shard-1", "shard-2")
        set_id = shards.membership.set_id
    recs = _records(urls)
    assert [r.shard_name for r in recs] == ["shard-0", "shard-1", "shard-2"]
    assert {r.set_id for r in recs} == {set_id} and {r.generation for r in recs} == {1}
    assert all(r.members == ("shard-0", "shard-1", "shard-2") for r in recs)
    with fencepost.open_shards(urls) as again:
        assert again.membership.set_id == set_id


def test_named_shards_record_their_names(shard_urls) -> None:
    a, b = shard_urls(2)
    with fencepost.open_shards({"edge-1": a, "central": b}) as shards:
        assert shards.names == ("edge-1", "central")
    _refused({"edge-1": a, "edge-2": b}, "another name or position")


def test_a_missing_shard_is_refused(shard_urls) -> None:
    urls = shard_urls(3)
    fencepost.open_shards(urls).close()
    _refused(urls[:2], "a shard is missing")


def test_an_extra_store_is_refused(shard_urls) -> None:
    urls = shard_urls(3)
    fencepost.open_shards(urls[:2]).close()
    _refused(urls, "shard #2 is not a member")


def test_another_order_is_refused(shard_urls) -> None:
    urls = shard_urls(3)
    fencepost.open_shards(urls).close()
    _refused([urls[1], urls[0], urls[2]], "another name or position")


def test_a_store_of_another_set_is_refused(shard_urls) -> None:
    a, b, c, d = shard_urls(4)
    fencepost.open_shards([a, b]).close()
    fencepost.open_shards([c, d]).close()
    _refused([a, d], "belongs to another shard set")


def test_one_store_given_twice_is_refused(shard_urls) -> None:
    (a,) = shard_urls(1)
    with pytest.raises(ShardError):
        fencepost.open_shards([a, a])


@pytest.mark.parametrize("exists", [False, True])
def test_one_store_given_twice_is_refused_before_anything_is_written(shard_urls, exists: bool) -> None:
    """The same URL twice was opened (a fresh one created and migrated) and then founded as a set
    of two in one store: the refusal came from the founding record it had just written, so the
    store was left recording a member list with a shard that does not exist. Now the repeat is
    refused first, naming both positions: no database is created and no record is written."""
    (a,) = shard_urls(1)
    if exists:
        fencepost.open(a).close()
    with pytest.raises(ShardError) as err:
        fencepost.open_shards([a, a])
    assert err.value.code == "membership_mismatch"
    assert "shard #1 is the same database as shard #0" in str(err.value)
    assert a.split("?")[0] not in str(err.value)
    if exists:
        assert _records([a]) == [None]
    else:
        assert _untouched(a)


@pytest.mark.parametrize("exists", [False, True])
def test_one_sqlite_file_under_two_spellings_is_refused_before_anything_is_written(tmp_path, exists: bool) -> None:
    """Two URLs of one SQLite file (``dir/f.db`` and ``dir/./f.db``) are one database: refused
    without creating it or writing a membership record into it."""
    first = f"sqlite:///{tmp_path / 'f.db'}"
    second = f"sqlite:///{tmp_path}/./f.db"
    if exists:
        fencepost.open(first).close()
    with pytest.raises(ShardError) as err:
        fencepost.open_shards({"east": first, "west": second})
    assert err.value.code == "membership_mismatch" and "shard #1 is the same database as shard #0" in str(err.value)
    if exists:
        assert _records([first]) == [None]
    else:
        assert not (tmp_path / "f.db").exists()


def test_a_blank_store_standing_in_for_a_member_with_runs_is_refused(shard_urls) -> None:
    """Founding a set, then replacing one member by a fresh database: refused, not adopted."""
    a, b, c = shard_urls(3)
    fencepost.open_shards([a, b]).close()
    with fencepost.open(c) as blank:
        blank.runs.create("stray", "{}")  # a store with data and no record is no unfinished founding
    _refused([a, c], "shard #1 is not a member")


def test_a_concurrent_founder_that_already_wrote_runs_is_joined_not_refused(shard_urls, monkeypatch) -> None:
    """Two openers found one fresh set at once; the other one finishes founding and creates runs
    on every shard between this opener's first look (no record anywhere) and its adoption step.
    The stale "no record" must not count as a blank store with data: this opener joins the set.
    (Seen in the four-process shard race as ``shard #2 is not a member of this set``.)"""
    urls = shard_urls(3)
    real_read = ms.read
    seen: list[object] = []

    def read_then_let_the_other_opener_run(store):
        rec = real_read(store)
        seen.append(rec)
        if len(seen) == len(urls):  # this opener has just read the last store: all blank
            assert seen == [None, None, None]
            monkeypatch.setattr(ms, "read", real_read)
            with fencepost.open_shards(urls, clock=ManualClock(0)) as other:
                for i in range(12):
                    other.runs.create(f"r-{i}", "{}")
                seen.append(other.membership.set_id)
        return rec

    monkeypatch.setattr(ms, "read", read_then_let_the_other_opener_run)
    with fencepost.open_shards(urls, clock=ManualClock(0)) as shards:
        assert shards.membership.set_id == seen[-1]
        assert shards.runs.get("r-0") is not None
    recs = _records(urls)
    assert {r.set_id for r in recs} == {seen[-1]}
    assert [r.shard_name for r in recs] == ["shard-0", "shard-1", "shard-2"]


def test_growing_a_set_appends_and_old_lists_are_then_refused(shard_urls) -> None:
    urls = shard_urls(3)
    fencepost.open_shards(urls[:2]).close()
    with fencepost.open_shards(urls, grow=True) as grown:
        assert grown.membership.generation == 2
    _refused(urls[:2], "a shard is missing")
    fencepost.open_shards(urls).close()


def test_a_grow_may_not_reorder(shard_urls) -> None:
    a, b, c = shard_urls(3)
    fencepost.open_shards({"a": a, "b": b}).close()
    _refused({"a": b, "b": a, "c": c}, "another name or position", grow=True)
    _refused({"b": b, "a": a, "c": c}, "not a prefix", grow=True)


def test_an_interrupted_grow_is_refused_then_finished_by_growing_again(shard_urls) -> None:
    urls = shard_urls(3)
    fencepost.open_shards(urls[:2]).close()
    with fencepost.open_shards(urls[:2]) as shards:
        gen1 = shards.membership
    # The grow wrote the new list to the new store and the first member, then died.
    bigger = ms.Membership(gen1.set_id, "shard-0", ("shard-0", "shard-1", "shard-2"), 2)
    with fencepost.open(urls[0]) as s0:
        ms._record(s0, bigger, expected=ms.read(s0))
    with fencepost.open(urls[2]) as s2:
        ms._record(s2, ms.Membership(gen1.set_id, "shard-2", bigger.members, 2), expected=None)
    _refused(urls, "interrupted grow")
    with fencepost.open_shards(urls, grow=True) as shards:
        assert shards.membership.generation == 2
    assert {r.generation for r in _records(urls)} == {2}


def test_readonly_never_founds_a_set(shard_urls) -> None:
    urls = shard_urls(2)
    for u in urls:
        fencepost.open(u).close()
    _refused(urls, "no store of the given set", readonly=True)


@pytest.mark.parametrize("bad", [[], "sqlite:///x.db", {"bad name!": "sqlite:///x.db"}, [""]])
def test_bad_input_is_refused_before_opening_anything(bad) -> None:
    with pytest.raises(ShardError) as err:
        fencepost.open_shards(bad)
    assert err.value.code == "invalid_shards"
    assert "x.db" not in str(err.value) and "bad name" not in str(err.value)


@pytest.mark.parametrize("before", [1, 2])
def test_a_set_whose_store_grew_meanwhile_refuses_creates(shard_urls, before: int) -> None:
    """A process that opened the set before it grew is refused at its next create, never splits ids."""
    urls = shard_urls(before + 1)
    stale = fencepost.open_shards(urls[:before])
    try:
        fencepost.open_shards(urls, grow=True).close()
        refused = 0
        for i in range(20):
            try:
                stale.runs.create(f"late-{i}", "{}")
            except ShardError as err:
                assert err.code == "membership_changed"
                refused += 1
        assert refused == 20
    finally:
        stale.close()
    with fencepost.open_shards(urls) as shards:
        assert all(shards.locate(f"late-{i}") == shards.place(f"late-{i}") for i in range(20))
        for name, store in shards.items():
            assert store.feed.list_runs().runs == [], name


def _set_with_runs(a: str, b: str) -> list[str]:
    """Found ``[a, b]`` and create 20 runs; the ids that landed on shard-1 (b)."""
    with fencepost.open_shards([a, b]) as shards:
        ids = [f"order-{i}" for i in range(20)]
        for rid in ids:
            shards.runs.create(rid, "{}")
        on_b = [rid for rid in ids if shards.locate(rid) == "shard-1"]
    assert on_b and len(on_b) < 20
    return on_b


def test_a_new_store_in_place_of_a_member_is_refused_and_never_created(shard_urls) -> None:
    """A never-used database given where shard b was: refused, not adopted (b's runs would vanish)."""
    a, b, fresh = shard_urls(3)
    on_b = _set_with_runs(a, b)
    before = _records([a])
    with pytest.raises(ShardError) as err:
        fencepost.open_shards([a, fresh])
    assert err.value.code == "membership_mismatch"
    assert "shard #1" in str(err.value) and fresh.split("?")[0] not in str(err.value)
    assert _untouched(fresh)
    assert _records([a]) == before
    with fencepost.open_shards([a, b]) as shards:
        assert shards.runs.get(on_b[0]).run_id == on_b[0]


def test_an_empty_migrated_store_in_place_of_a_member_of_a_used_set_is_refused(shard_urls) -> None:
    """An existing, empty store that records no set, given for a member of a set that holds runs:
    no unfinished founding (runs exist only once a founding finished), so refused."""
    a, b, blank = shard_urls(3)
    on_b = _set_with_runs(a, b)
    fencepost.open(blank).close()
    _refused([a, blank], "shard #1 is not a member")
    with fencepost.open_shards([a, b]) as shards:
        assert shards.runs.get(on_b[0]).run_id == on_b[0]


def test_an_unfinished_founding_is_finished_by_the_next_opener(shard_urls) -> None:
    """The founder recorded the first store, then died before the others: the next open finishes it."""
    urls = shard_urls(3)
    for url in urls:
        fencepost.open(url).close()
    with fencepost.open(urls[0]) as s0:
        ms._record(s0, ms.Membership("f" * 32, "shard-0", ("shard-0", "shard-1", "shard-2"), 1), expected=None)
    with fencepost.open_shards(urls) as shards:
        assert shards.membership.set_id == "f" * 32
        shards.runs.create("r-1", "{}")
    recs = _records(urls)
    assert {r.set_id for r in recs} == {"f" * 32}
    assert [r.shard_name for r in recs] == ["shard-0", "shard-1", "shard-2"]


def test_a_set_is_founded_on_empty_stores_only(shard_urls) -> None:
    a, b = shard_urls(2)
    with fencepost.open(b) as s:
        s.runs.create("stray", "{}")
    with pytest.raises(ShardError) as err:
        fencepost.open_shards([a, b])
    assert err.value.code == "membership_mismatch" and "shard #1 holds runs" in str(err.value)
    assert _untouched(a)
    assert _records([b]) == [None]


def test_an_extra_new_store_is_refused_before_it_is_created(shard_urls) -> None:
    a, b, new = shard_urls(3)
    fencepost.open_shards([a, b]).close()
    before = _records([a, b])
    with pytest.raises(ShardError) as err:
        fencepost.open_shards([a, b, new])
    assert err.value.code == "membership_mismatch" and "shard #2" in str(err.value)
    assert _untouched(new)
    assert _records([a, b]) == before
    with fencepost.open_shards([a, b, new], grow=True) as grown:  # growing still creates it
        assert grown.names == ("shard-0", "shard-1", "shard-2")


@pytest.mark.parametrize(("kw", "field"), [
    ({"attempt_policy": {"in_progress_states": ["x"]}}, "attempt_policy"),
    ({"readonly": "no"}, "readonly"),
    ({"grow": 1}, "grow"),
    ({"clock": 5}, "clock"),
])
def test_bad_options_are_refused_before_any_store_is_created(shard_urls, kw, field) -> None:
    urls = shard_urls(2)
    with pytest.raises(FencepostError) as err:
        fencepost.open_shards(urls, **kw)
    assert field in str(err.value)
    assert all(_untouched(u) for u in urls)


@pytest.mark.parametrize("blank_exists", [False, True])
def test_a_grow_may_not_put_a_new_store_in_place_of_a_member(shard_urls, blank_exists: bool) -> None:
    """``grow=True`` appends stores; a store given where a member was is no new shard."""
    a, b, stand_in, c = shard_urls(4)
    on_b = _set_with_runs(a, b)
    if blank_exists:
        fencepost.open(stand_in).close()
    before = _records([a, b])
    with pytest.raises(ShardError) as err:
        fencepost.open_shards([a, stand_in, c], grow=True)
    assert err.value.code == "membership_mismatch" and "shard #1 is not a member" in str(err.value)
    assert _records([a, b]) == before
    assert _untouched(c)
    assert _untouched(stand_in) != blank_exists
    with fencepost.open_shards([a, b]) as shards:
        assert shards.runs.get(on_b[0]).run_id == on_b[0]


def test_a_store_newer_than_the_code_is_refused_before_another_is_created(shard_urls) -> None:
    """``open_shards([new, newer])``: the store migrated by a newer fencepost was refused
    (``schema_too_new``) only when its turn to open came, after the stores before it had been
    created and migrated. It is refused by the read-only look now, before anything is created."""
    from sqlalchemy import text

    from fencepost._durable import Database
    from fencepost.errors import OpenError

    new, newer = shard_urls(2)
    fencepost.open(newer).close()
    db = Database(newer)
    db.write(lambda conn: conn.execute(text("INSERT INTO flows_migrations (migration_id, name) "
                                            "VALUES (4999, 'shards_from_the_future')")))
    db.dispose()
    with pytest.raises(OpenError) as err:
        fencepost.open_shards([new, newer])
    assert err.value.code == "schema_too_new" and "4999" in str(err.value)
    assert _untouched(new)


def test_a_store_whose_ledger_names_a_migration_otherwise_is_refused_before_another_is_created(shard_urls) -> None:
    """``open_shards([new, renamed])``: a store whose ledger records one of this code's migrations
    under another name was refused only when its turn to migrate came, after the stores before it
    had been created. It is refused by the read-only look now (``schema_mismatch``)."""
    from sqlalchemy import text

    from fencepost._durable import Database
    from fencepost.errors import OpenError

    new, renamed = shard_urls(2)
    fencepost.open(renamed).close()
    db = Database(renamed)
    db.write(lambda conn: conn.execute(text("UPDATE flows_migrations SET name = 'shards_other' "
                                            "WHERE migration_id = 4001")))
    db.dispose()
    with pytest.raises(OpenError) as err:
        fencepost.open_shards([new, renamed])
    assert err.value.code == "schema_mismatch" and "4001" in str(err.value)
    assert _untouched(new)
