"""The README's Python example runs as written, in a fresh working directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests._docs import python_blocks

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs_on_the_embedded_default(tmp_path: Path) -> None:
    blocks = python_blocks(README)
    assert blocks, "README has no python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0], encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".flows" / "flows.db").exists()
    assert done.stdout.split() == ["6", "invoice-42", "completed"]
