"""Paging a listing merged from several stores is the change feed's, not the command line's.

``listing_page`` and ``merged_page`` page ``ChangeFeed.list_runs`` (one store's keyset cursor,
several stores' cursor across them): ``fencepost runs list`` and the console both use them from
``fencepost.changefeed.merged``; neither imports the other for it. Run on both backends.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import fencepost

SRC = Path(__file__).resolve().parents[2] / "src" / "fencepost"


def _imports_of(path: Path) -> set[tuple[str, str]]:
    """``(module, name)`` of every ``from module import name`` in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {(node.module or "", alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            for alias in node.names}


def test_the_console_and_the_cli_take_the_merged_listing_from_the_change_feed():
    """Before: both lived in ``fencepost.cli.runs`` and the console imported the command module."""
    for user in (SRC / "ui" / "views.py", SRC / "cli" / "runs.py"):
        found = _imports_of(user)
        assert ("fencepost.cli.runs", "merged_page") not in found and ("fencepost.cli.runs", "listing_page") \
            not in found, user
    assert ("fencepost.changefeed.merged", "merged_page") in _imports_of(SRC / "ui" / "views.py")
    assert ("fencepost.changefeed.merged", "merged_page") in _imports_of(SRC / "cli" / "runs.py")


def test_merged_page_pages_two_stores_newest_first_without_skipping_or_repeating(make_db_url: Any) -> None:
    from fencepost.changefeed.merged import listing_page, merged_page

    urls = {"a": make_db_url(), "b": make_db_url()}
    stores = {name: fencepost.open(url) for name, url in urls.items()}
    try:
        for i in range(7):
            for name, store in stores.items():
                store.runs.create(f"{name}-{i}", "{}")
        listed, cursor = listing_page(stores["a"], None, None, 5, True)
        assert [r.run_id for r in listed] == [f"a-{i}" for i in (6, 5, 4, 3, 2)] and cursor is not None
        seen: list[tuple[str, str]] = []
        cursor = None
        for _ in range(10):
            shown, cursor = merged_page(stores, {}, cursor, 4, True)
            seen += [(name, row.run_id) for name, row in shown]
            if cursor is None:
                break
        assert len(seen) == len(set(seen)) == 14
        assert sorted(seen) == sorted((n, f"{n}-{i}") for n in stores for i in range(7))
        created = [stores[n].runs.get(r).created_at_ms for n, r in seen]
        assert created == sorted(created, reverse=True)
    finally:
        for store in stores.values():
            store.close()
