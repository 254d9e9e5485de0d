"""Every example of the worker guide runs as written (docs/guides/worker.md)."""

from __future__ import annotations

import os
import runpy
import shlex
import subprocess
import uuid

import pytest

from tests._docs import DOCS, python_blocks, shell_blocks
from tests.cli.conftest import fencepost_exe
from tests.conftest import drop_schema, require_postgres

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


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_command_line_section_runs_as_written(backend, tmp_path):
    """``mytasks.py`` as the guide writes it, then its shell lines in order, from the folder that holds it
    (on PostgreSQL each line gets ``--db`` naming a fresh schema)."""
    (tmp_path / "mytasks.py").write_text(next(b for b in python_blocks(GUIDE) if b.startswith("# mytasks.py")))
    lines = [line for line in shell_blocks(GUIDE)[0].splitlines() if line.strip()]
    db: list[str] = []
    if backend == "postgres":
        base = require_postgres()
        schema = "t_" + uuid.uuid4().hex[:16]
        db = ["--db", f"{base}?schema={schema}"]
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    try:
        outputs = []
        for line in lines:
            args = shlex.split(line, comments=True)
            assert args[0] == "fencepost", line
            done = subprocess.run([fencepost_exe(), *db, *args[1:]], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
            outputs.append(done.stdout)
    finally:
        if db:
            drop_schema(base, schema)
    shown = dict(line.split(None, 1) for line in outputs[-1].splitlines() if " " in line.strip())
    assert shown["status"].strip() == "completed"
    assert shown["state_json"].strip() == '{"done":3,"result":"ok"}'
