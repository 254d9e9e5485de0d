"""Shard membership: a misconfigured set is refused, naming the rule, and changes nothing."""

from __future__ import annotations

import pytest

import fencepost
from fencepost.clock import ManualClock
from fencepost.shards import ShardError
from fencepost.shards import membership as ms


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
        ms._record(s0, bigger)
    with fencepost.open(urls[2]) as s2:
        ms._record(s2, ms.Membership(gen1.set_id, "shard-2", bigger.members, 2))
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
