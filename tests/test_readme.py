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


def test_the_readme_lists_every_command_of_the_cli():
    """The "Command line" paragraph names each leaf command (``runs list|show|...``) the CLI has."""
    import re

    import click

    from fencepost.cli import cli

    text = README.read_text(encoding="utf-8")
    paragraph = text[text.index("`fencepost [--db URL] COMMAND`"):text.index("Every read command")]
    listed = set()
    for item in re.findall(r"`([a-z]+(?: [a-z|]+)?)(?: \[--follow\])?`", paragraph.split("—", 1)[1]):
        group, _, leaves = item.partition(" ")
        listed |= {f"{group} {leaf}".strip() for leaf in leaves.split("|")} if leaves else {group}

    def leaves_of(command: click.Command, prefix: str = "") -> set[str]:
        if isinstance(command, click.Group):
            return set().union(*(leaves_of(sub, f"{prefix} {name}".strip()) for name, sub in command.commands.items()))
        return {prefix}

    assert listed == leaves_of(cli)
