"""The package layout keeps its promises: ownership arbitration is run-store semantics, so nothing
under ``journal/`` may import from ``runstore/`` (the journal is the lower layer); and the web
console shows stored text with the package's shared helpers, not the CLI's output layer; nor does it
import the CLI at all (the helpers both use live below them)."""

from __future__ import annotations

import ast
from pathlib import Path

import fencepost

PACKAGE = Path(fencepost.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (function bodies too)."""
    return _imports_of(path.read_text(), ["fencepost", *path.relative_to(PACKAGE).parent.parts], str(path))


def _imports_of(text: str, package: list[str], name: str = "<probe>") -> set[str]:
    """The modules ``text`` imports; relative imports are resolved against ``package``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(text, name)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
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


def test_the_console_never_imports_the_cli():
    """Nothing under ``fencepost.ui`` imports ``fencepost.cli``, not even inside a function: the
    helpers the console and the CLI share (whether a store holds a run, a run's lease-reconfirmed
    warnings) live in the run store, so the console works without the CLI's modules and a change
    to the CLI cannot reach into its pages."""
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            m for m in _imports(path) if m == "fencepost.cli" or m.startswith("fencepost.cli."))
        for path in sorted((PACKAGE / "ui").rglob("*.py"))
    }
    assert list(offenders) and {k: v for k, v in offenders.items() if v} == {}


def test_relative_imports_are_resolved():
    """The scan above sees ``from ..cli import x`` as ``fencepost.cli`` too."""
    found = _imports_of("from ..cli import runs\nfrom . import views\nimport json\n", ["fencepost", "ui"])
    assert found == {"fencepost.cli", "fencepost.cli.runs", "fencepost.ui", "fencepost.ui.views", "json"}
