"""The Python snippets in docs/concepts/projections.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

from tests._docs import DOCS, run_snippets

DOC = DOCS / "concepts" / "projections.md"


def test_projections_page_snippets_run() -> None:
    run_snippets(DOC, "projections_doc")


def test_projections_page_names_every_test_it_cites() -> None:
    text = DOC.read_text()
    cited = set(re.findall(r"`(?:[a-z_]+\.py::)?(test_[a-z0-9_]+)`", text))
    here = Path(__file__).parent
    defined = set(re.findall(r"^def (test_[a-z0-9_]+)", "\n".join(p.read_text() for p in here.glob("test_*.py")),
                             re.MULTILINE))
    assert cited and cited <= defined, sorted(cited - defined)
