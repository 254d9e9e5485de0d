"""The Python snippets of the run-store concept pages run as written."""

from __future__ import annotations

import pytest

from tests._docs import DOCS, run_snippets


@pytest.mark.parametrize("page", ["fencing.md", "leases.md", "durable-values.md"])
def test_concept_page_snippets_run(page: str) -> None:
    run_snippets(DOCS / "concepts" / page, "runstore_doc")
