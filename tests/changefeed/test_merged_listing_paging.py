"""A listing merged across stores keeps paging a store whose listing ran out, as its own listing would.

One store's listing is live (docs/concepts/change-feed.md, "Pages are live"): the next page starts
strictly after the last key handed out, so a run created later with a larger key appears on a later
page. Merged across stores (``merged_page``, over a shard set or independent stores), a store that
had nothing more when a page was read keeps its position after the last run it returned, so runs
created there since appear on the next pages like the other stores' new runs: paging neither skips
nor repeats a run. Before, such a store was marked done (``null`` in the cursor) and its later runs
were never listed. Run on both backends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import fencepost
from fencepost.changefeed.cursor import decode_across, encode_across
from fencepost.changefeed.merged import merged_page
from fencepost.clock import ManualClock
from fencepost.shards import place


class Stores:
    """Independent stores by name, each with its own manual clock (creation times set per run)."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.clocks = {name: ManualClock(0) for name in urls}
        self.stores = {name: fencepost.open(url, clock=self.clocks[name]) for name, url in urls.items()}

    def create(self, name: str, run_id: str, at_ms: int) -> None:
        clock = self.clocks[name]
        clock.advance(at_ms - clock.now_ms())
        self.stores[name].runs.create(run_id, json.dumps({"flowName": "f"}))

    def close(self) -> None:
        for store in self.stores.values():
            store.close()


@pytest.fixture
def three(make_db_url: Any) -> Iterator[Stores]:
    """``a`` with a1 (oldest); ``b`` with b1..b5; ``c`` empty."""
    stores = Stores({"a": make_db_url(), "b": make_db_url(), "c": make_db_url()})
    try:
        stores.create("a", "a1", 1000)
        for i in range(1, 6):
            stores.create("b", f"b{i}", 1000 + 1000 * i)
        yield stores
    finally:
        stores.close()


def _ids(shown: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    return [(name, row.run_id) for name, row in shown]


def test_runs_created_on_a_store_whose_listing_ran_out_appear_on_the_next_pages(three: Stores) -> None:
    shown, cursor = merged_page(three.stores, None, None, 3, False)
    assert _ids(shown) == [("a", "a1"), ("b", "b1"), ("b", "b2")]
    assert cursor is not None  # b has more; a and c have nothing more right now
    # Created between pages: on a (ran out after a1), on c (never returned a run) and on b.
    three.create("a", "a-late", 7000)
    three.create("c", "c-late", 7500)
    three.create("b", "b-late", 8000)
    seen = _ids(shown)
    for _ in range(10):
        shown, cursor = merged_page(three.stores, None, cursor, 3, False)
        seen += _ids(shown)
        if cursor is None:
            break
    assert seen == [("a", "a1"), ("b", "b1"), ("b", "b2"), ("b", "b3"), ("b", "b4"), ("b", "b5"),
                    ("a", "a-late"), ("c", "c-late"), ("b", "b-late")]


def test_a_store_that_ran_out_is_listed_again_after_its_last_run_not_from_the_start(three: Stores) -> None:
    """Out of runs on page after page, its later runs come once each, none of its earlier ones again."""
    for i in range(6, 21):
        three.create("b", f"b{i}", 1000 + 1000 * i)
    shown, cursor = merged_page(three.stores, {}, None, 2, False)
    assert _ids(shown) == [("a", "a1"), ("b", "b1")]
    seen = _ids(shown)
    for step in range(100):
        if step < 8 and step % 2 == 0:  # a's next run, shown on the next page: a runs out again there
            three.create("a", f"a-{step}", shown[-1][1].created_at_ms + 1)
        shown, cursor = merged_page(three.stores, {}, cursor, 2, False)
        seen += _ids(shown)
        if step < 8 and step % 2 == 0:
            assert ("a", f"a-{step}") in _ids(shown)
        if cursor is None:
            break
    assert len(seen) == len(set(seen))
    assert [r for n, r in seen if n == "a"] == ["a1", "a-0", "a-2", "a-4", "a-6"]
    assert [r for n, r in seen if n == "b"] == [f"b{i}" for i in range(1, 21)]


def test_the_listing_still_ends_when_every_store_has_run_out(three: Stores) -> None:
    seen: list[tuple[str, str]] = []
    cursor = None
    pages = 0
    while True:
        shown, cursor = merged_page(three.stores, None, cursor, 4, False)
        seen += _ids(shown)
        pages += 1
        if cursor is None:
            break
    assert pages == 2 and len(seen) == 6


def test_newest_first_a_store_that_ran_out_behaves_as_its_own_listing(three: Stores) -> None:
    """Newest first, a run created later sorts before a store's position: its own listing would not
    show it, nor does the merged one; a store that has returned no run yet is listed from its start."""
    shown, cursor = merged_page(three.stores, None, None, 5, True)
    assert _ids(shown) == [("b", "b5"), ("b", "b4"), ("b", "b3"), ("b", "b2"), ("b", "b1")]
    three.create("a", "a-late", 9000)  # a returned no run yet: listed from its newest
    three.create("b", "b-late", 9500)  # b ran out after b1: b-late is before its position
    rest: list[tuple[str, str]] = []
    while cursor is not None:
        shown, cursor = merged_page(three.stores, None, cursor, 5, True)
        rest += _ids(shown)
    assert rest == [("a", "a-late"), ("a", "a1")]


def test_a_cursor_of_the_earlier_code_with_a_store_marked_done_is_still_accepted(three: Stores) -> None:
    """``null`` for a store (what the earlier code wrote for a store that had run out; the console
    still writes it beside a store that does not answer): that store is not listed again."""
    shown, cursor = merged_page(three.stores, None, None, 3, False)
    assert cursor is not None
    after = decode_across(cursor, list(three.stores))
    assert isinstance(after["a"], str) and "c" not in after  # a: its position; c returned nothing yet
    old = encode_across({"a": None, "b": after["b"], "c": None})
    three.create("a", "a-late", 7000)
    rest: list[tuple[str, str]] = []
    while old is not None:
        shown, old = merged_page(three.stores, None, old, 3, False)
        rest += _ids(shown)
    assert rest == [("b", "b3"), ("b", "b4"), ("b", "b5")]


def test_over_a_shard_set_runs_created_on_an_exhausted_shard_appear(make_db_url: Any) -> None:
    clock = ManualClock(0)
    with fencepost.open_shards([make_db_url(), make_db_url()], clock=clock) as shards:
        names = [name for name, _ in shards.items()]

        def ids_on(shard: str, prefix: str, n: int) -> list[str]:
            found = [f"{prefix}{i}" for i in range(1000) if place(f"{prefix}{i}", names) == shard]
            return found[:n]

        def create(run_ids: list[str]) -> None:
            for run_id in run_ids:
                clock.advance(10)
                shards.runs.create(run_id, "{}")

        first = ids_on(names[1], "one-", 1)
        many = ids_on(names[0], "zero-", 5)
        create(first + many)
        stores = dict(shards.items())
        shown, cursor = merged_page(stores, None, None, 3, False)
        assert _ids(shown) == [(names[1], first[0]), (names[0], many[0]), (names[0], many[1])]
        late = ids_on(names[1], "late-one-", 2) + ids_on(names[0], "late-zero-", 1)
        create(late)
        seen = _ids(shown)
        while cursor is not None:
            shown, cursor = merged_page(stores, None, cursor, 3, False)
            seen += _ids(shown)
        assert len(seen) == len(set(seen)) == 9
        assert {r for _, r in seen} == set(first + many + late)
        assert [r for _, r in seen] == first + many + late  # in creation order
