"""The Python snippets in docs/concepts/journal.md run as written."""

from __future__ import annotations

from tests._docs import DOCS, run_snippets

DOC = DOCS / "concepts" / "journal.md"


def test_journal_page_snippets_run() -> None:
    run_snippets(DOC, "journal_doc")
