"""docs/guides/custom-projection.md: its two complete projections run as written, and its field
tables list exactly the fields of the types a projection receives."""

from __future__ import annotations

import re

import msgspec
import pytest

import fencepost
from fencepost.projections import ConsensusFact
from tests._docs import DOCS, run_snippets

GUIDE = DOCS / "guides" / "custom-projection.md"


def test_the_custom_projection_guide_runs() -> None:
    run_snippets(GUIDE, "custom_projection_guide")


def _tables(text: str) -> dict[str, list[str]]:
    """The first-column names of each ``| field | type | meaning |`` table, keyed by the type named
    in the paragraph above it."""
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"`fencepost\.(?:projections\.)?(\w+)`[^\n]*\n(?:[^|\n][^\n]*\n)*\n?"
                             r"\| field \| type \| meaning \|\n\|---\|---\|---\|\n((?:\|[^\n]*\n)+)", text):
        found[match.group(1)] = re.findall(r"^\| `(\w+)` \|", match.group(2), re.M)
    return found


@pytest.mark.parametrize("struct", [fencepost.Observed, fencepost.Missing, ConsensusFact])
def test_the_guide_lists_every_field_of_each_update_type(struct: type[msgspec.Struct]) -> None:
    tables = _tables(GUIDE.read_text())
    assert tables.get(struct.__name__) == list(struct.__struct_fields__)
