"""The worker guide's first example runs as written (docs/guides/worker.md)."""

from __future__ import annotations

import runpy

from tests._docs import DOCS, python_blocks

GUIDE = DOCS / "guides" / "worker.md"


def test_the_worker_guide_example_runs(tmp_path, monkeypatch):
    blocks = python_blocks(GUIDE)
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FENCEPOST_DB", raising=False)
    runpy.run_path(str(script), run_name="__main__")
    assert (tmp_path / ".flows" / "flows.db").exists()
