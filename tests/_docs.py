"""Run the Python snippets of a documentation page, as every docs test does."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"

_PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def python_blocks(page: Path) -> list[str]:
    """Return the bodies of the page's fenced ``python`` blocks, in order."""
    return _PYTHON_BLOCK.findall(page.read_text(encoding="utf-8"))


def run_snippets(page: Path, module_name: str) -> None:
    """Execute each ``python`` block of ``page`` on its own (a fresh namespace); the page must have one."""
    blocks = python_blocks(page)
    assert blocks, f"{page.name} has no python snippet"
    for block in blocks:
        exec(compile(block, str(page), "exec"), {"__name__": module_name})


_SHELL_BLOCK = re.compile(r"```(?:sh|bash|console)\n(.*?)```", re.DOTALL)


def shell_blocks(page: Path) -> list[str]:
    """Return the bodies of the page's fenced shell blocks (``sh``, ``bash``), in order."""
    return _SHELL_BLOCK.findall(page.read_text(encoding="utf-8"))
