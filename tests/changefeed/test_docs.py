"""The Python snippets in docs/concepts/change-feed.md run as written."""

from __future__ import annotations

from tests._docs import DOCS, run_snippets

DOC = DOCS / "concepts" / "change-feed.md"


def test_change_feed_page_snippets_run() -> None:
    run_snippets(DOC, "change_feed_doc")
