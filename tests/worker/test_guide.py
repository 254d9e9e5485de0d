"""Every example of the worker guide runs as written (docs/guides/worker.md)."""

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


def test_every_worker_guide_fragment_runs(tmp_path, monkeypatch):
    """Each python block is a complete program: run each on its own, in a fresh folder."""
    blocks = python_blocks(GUIDE)
    assert len(blocks) >= 2
    monkeypatch.delenv("FENCEPOST_DB", raising=False)
    for index, block in enumerate(blocks):
        folder = tmp_path / f"block-{index}"
        folder.mkdir()
        monkeypatch.chdir(folder)
        exec(compile(block, f"{GUIDE.name}[{index}]", "exec"), {"__name__": "__main__"})
