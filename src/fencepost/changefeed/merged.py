"""Pages of a runs listing, of one store or merged from several named stores.

``listing_page`` gathers up to ``limit`` entries of one store's keyset listing (``list_runs``
pages at most 200 at a time); ``merged_page`` merges several stores' listings by (created, run id,
store name) under one cursor across them (``cursor.encode_across``). ``fencepost runs list`` and the
console's runs page both page with them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fencepost.changefeed.cursor import MAX_LIST_LIMIT, decode_across, encode_across, encode_cursor, parse_filters

if TYPE_CHECKING:
    from fencepost._store import Store

#: A function paging one store: ``page(store, filters, cursor, limit, descending)`` gives the
#: rows after ``cursor`` (each with ``created_at_ms`` and ``run_id``) and the cursor after them.
Pager = Callable[..., tuple[list[Any], str | None]]


def listing_page(store: Store, filters: Mapping[str, Any] | None, cursor: str | None, limit: int,
                 descending: bool) -> tuple[list[Any], str | None]:
    """Up to ``limit`` listing entries (``list_runs``' own rows) after ``cursor``, and the next cursor."""
    listed: list[Any] = []
    while len(listed) < limit:
        page = store.feed.list_runs(filters, cursor, min(MAX_LIST_LIMIT, limit - len(listed)),
                                    newest_first=descending)
        listed.extend(page.runs)
        cursor = page.cursor
        if cursor is None:
            break
    return listed, cursor


def merged_page(stores: Mapping[str, Store], filters: Mapping[str, Any] | None, cursor: str | None, limit: int,
                descending: bool, page: Pager = listing_page) -> tuple[list[tuple[str, Any]], str | None]:
    """One page of a listing merged from several named stores: ``[(store name, row)]`` and the next cursor.

    Each store is listed with its own keyset cursor (``page(store, filters, cursor, limit,
    descending)``: ``listing_page`` for the listing's own entries, or a pager returning full rows);
    the candidates are merged by (created, run id, store name) and the first ``limit`` taken. The
    next cursor records, per store, the key after its last run shown, also when that store had
    nothing more to list: as with one store's listing, runs created there later with a larger key
    appear on the next pages, so paging neither skips nor repeats a run. A store that has shown no
    run is left out of it (listed from its start). ``None`` when no store had more to list.

    A store given ``null`` in the cursor is not listed again: the cursors of earlier versions wrote
    it for a store that had nothing more, and the console writes it beside a store that does not
    answer once the others are done. A cursor that is not one of a listing across these stores
    raises ``RunStoreError('invalid_cursor')``.
    """
    after = decode_across(cursor, list(stores))
    parsed = parse_filters(filters or None)
    fetched: dict[str, tuple[list[Any], str | None]] = {}
    for name, store in stores.items():
        if name in after and after[name] is None:
            continue  # marked done by the cursor (see above)
        fetched[name] = page(store, filters, after.get(name), limit, descending)
    candidates = [(row.created_at_ms, row.run_id, name, row) for name, (rows, _) in fetched.items() for row in rows]
    candidates.sort(key=lambda c: (c[0], c[1], c[2]), reverse=descending)
    shown = candidates[:limit]
    resume = dict(after)
    more = False
    for name, (rows, page_cursor) in fetched.items():
        taken = [c for c in shown if c[2] == name]
        if len(taken) < len(rows) or page_cursor is not None:
            more = True
        if taken and len(taken) == len(rows) and page_cursor is not None:
            resume[name] = page_cursor  # its own cursor: after the last run it returned
        elif taken:
            # After its last run shown, also when nothing followed it: runs created there later appear.
            last = taken[-1][3]
            resume[name] = encode_cursor(stores[name].feed.position().source, parsed, last.created_at_ms,
                                         last.run_id, newest_first=descending)
    return [(name, row) for _, _, name, row in shown], encode_across(resume) if more else None
