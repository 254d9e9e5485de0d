"""The package layout keeps its promises: ownership arbitration is run-store semantics, so nothing
under ``journal/`` may import from ``runstore/`` (the journal is the lower layer); and the web
console shows stored text with the package's shared helpers, not the CLI's output layer."""

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


def test_the_console_shows_text_without_the_cli():
    """The web console escapes stored text with the package's own ``_printable`` (shared with the
    CLI), never through the CLI's output layer: a change to how the CLI lays out tables must not
    reach into the console's pages."""
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(m for m in _imports(path) if m.startswith("fencepost.cli._output"))
        for path in sorted((PACKAGE / "ui").rglob("*.py"))
    }
    assert list(offenders) and {k: v for k, v in offenders.items() if v} == {}
    shared = _imports(PACKAGE / "_printable.py")
    assert not {m for m in shared if m.startswith(("fencepost.cli", "fencepost.ui"))}, shared
