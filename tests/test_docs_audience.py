"""The user-facing docs (docs/, README.md, the CLI help that renders into docs/cli.md) speak to users:
no reference to the project's internal documents or to their scenario ids."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])

# Prefixes of the internal scenario ids ("RS-26", "JN-55", ...); UTF-16 and SHA-256 are not ids.
_ID_PREFIXES = ("AB AO AS BD CC CS CU DW EB EC EI EM EO ER ES JD JF JG JN LF LN LO MT OC OT OW RD RL RM RS "
                "RX SC SP DUR REL").split()
INTERNAL = [
    ("an internal document", re.compile(r"\bSPEC\b|SPEC\.md|\bREFERENCE\b|\bPITFALLS\b|UPSTREAM-TESTS|STYLE\.md")),
    ("the seeds", re.compile(r"\bseeds?\b", re.IGNORECASE)),
    # The system the contract was ported from: a user has never seen it, so "as upstream" says nothing.
    ("the ported-from system", re.compile(r"\bupstream\b", re.IGNORECASE)),
    ("a scenario id", re.compile(rf"\b(?:{'|'.join(_ID_PREFIXES)})-\d{{1,3}}\b")),
    ("a scenario section", re.compile(r"\b[ABCD]\d{1,2}\b")),
    ("a numbered case", re.compile(r"\b(?:fault )?case ?\d+\b|test_case\d+", re.IGNORECASE)),
]


def internal_references(text: str) -> list[str]:
    """Every ``what: line`` where ``text`` names an internal document or scenario."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in INTERNAL:
            match = pattern.search(line)
            if match:
                found.append(f"{number}: {what} ({match.group(0)!r}): {line.strip()[:120]}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_user_docs_never_mention_internal_documents_or_scenario_ids(page):
    assert internal_references(page.read_text(encoding="utf-8")) == []


def test_the_cli_help_never_mentions_them_either():
    from fencepost.cli._docs import render

    assert internal_references(render()) == []


@pytest.mark.parametrize("line", [
    "as SPEC 6 says", "see REFERENCE 4", "PITFALLS \"x\"", "UPSTREAM-TESTS B1", "the seed's tag", "RS-26",
    "(A3 scenarios)", "fault case 22", "test_case22_secret.py",
    "not upstream's NUMERIC", "as Upstream has it", "the C-DUR-01 harness", "the T-REL-04 matrix",
])
def test_the_check_catches_each_kind(line):
    assert internal_references(line)


@pytest.mark.parametrize("line", ["SHA-256 over UTF-16 units", "ISO-8601", "a reference page", "in any case"])
def test_the_check_leaves_plain_words_alone(line):
    assert internal_references(line) == []
