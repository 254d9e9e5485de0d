"""The Python snippets of the run-store concept pages run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "concepts"


@pytest.mark.parametrize("page", ["fencing.md", "leases.md", "durable-values.md"])
def test_concept_page_snippets_run(page: str) -> None:
    text = (DOCS / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, str(DOCS / page), "exec"), {"__name__": "runstore_doc"})
