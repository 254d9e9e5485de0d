"""The Python snippet of docs/guides/ui.md runs as written (on a store made for it in a fresh directory)."""

from __future__ import annotations

import fencepost
from tests._docs import DOCS, run_snippets

DOC = DOCS / "guides" / "ui.md"


def test_console_guide_snippet_runs(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    fencepost.open().close()  # .flows/flows.db, created and migrated, as `fencepost demo` would leave it
    run_snippets(DOC, "ui_doc")
    assert capsys.readouterr().out.startswith("http://127.0.0.1:")
