"""The snippets in docs/concepts/shards.md run as written: the Python ones, and the command lines
of its first shell block, one after another in one folder (on SQLite as written, and on
PostgreSQL with each file a schema of its own)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import uuid

import pytest

from tests._docs import DOCS, run_snippets, shell_blocks
from tests.cli.conftest import fencepost_exe
from tests.conftest import drop_schema, require_postgres

DOC = DOCS / "concepts" / "shards.md"

# The module the page's `worker --task mytasks:work` imports, as the worker guide writes it.
MYTASKS = "def work(ctx):\n    return {**ctx.state, 'done': True}\n"


def test_shards_page_snippets_run() -> None:
    run_snippets(DOC, "shards_doc")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_command_lines_of_the_shards_page_run_in_order(backend, tmp_path):
    lines = [line for line in shell_blocks(DOC)[0].splitlines() if line.strip()]
    schemas: dict[str, str] = {}
    if backend == "postgres":
        base = require_postgres()

        def to_schema(match: re.Match) -> str:
            name = schemas.setdefault(match.group(1), "t_" + uuid.uuid4().hex[:16])
            return f"{base}?schema={name}"

        lines = [re.sub(r"sqlite:///(\w+)\.db", to_schema, line) for line in lines]
    (tmp_path / "mytasks.py").write_text(MYTASKS)
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    try:
        for line in lines:
            args = shlex.split(line, comments=True)
            if "postgresql+psycopg://host/db" in line:
                continue  # a database of the reader's own
            assert args[0] == "fencepost", line
            done = subprocess.run([fencepost_exe(), *args[1:]], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    finally:
        for schema in schemas.values():
            drop_schema(base, schema)
