"""The worker guide's first example runs as written (docs/guides/worker.md)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "worker.md"


def test_the_worker_guide_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FENCEPOST_DB", raising=False)
    runpy.run_path(str(script), run_name="__main__")
    assert (tmp_path / ".flows" / "flows.db").exists()
