"""The Python snippets in docs/concepts/shards.md run as written."""

from __future__ import annotations

from tests._docs import DOCS, run_snippets

DOC = DOCS / "concepts" / "shards.md"


def test_shards_page_snippets_run() -> None:
    run_snippets(DOC, "shards_doc")
