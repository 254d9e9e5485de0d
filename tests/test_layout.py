"""The package layout keeps its promises: ownership arbitration is run-store semantics, so nothing
under ``journal/`` may import from ``runstore/`` (the journal is the lower layer)."""

from __future__ import annotations

import ast
from pathlib import Path

import fencepost

PACKAGE = Path(fencepost.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_journal_never_imports_the_run_store():
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(m for m in _imports(path) if m.startswith("fencepost.runstore"))
        for path in sorted((PACKAGE / "journal").rglob("*.py"))
    }
    assert list(offenders) and {k: v for k, v in offenders.items() if v} == {}
