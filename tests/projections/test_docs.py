"""The Python snippets in docs/concepts/projections.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "projections.md"


def test_projections_page_snippets_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {"__name__": "projections_doc"})


def test_projections_page_names_every_test_it_cites() -> None:
    text = DOC.read_text()
    cited = set(re.findall(r"`(?:[a-z_]+\.py::)?(test_[a-z0-9_]+)`", text))
    here = Path(__file__).parent
    defined = set(re.findall(r"^def (test_[a-z0-9_]+)", "\n".join(p.read_text() for p in here.glob("test_*.py")),
                             re.MULTILINE))
    assert cited and cited <= defined, sorted(cited - defined)
