"""The samples of the README and docs/ cannot drift from the code unnoticed.

- Every page with a Python sample has its samples run by a test (the pages' own tests run them as
  written; this only checks that a new page is not left out).
- Every ``fencepost`` command line in a shell block names a command and options that exist, with
  values the CLI accepts: a user copying one never meets ``No such option``. The lines are parsed by
  the CLI itself (click's parser, with every option's type and check), not run: many name a
  database of the reader's own (``postgresql+psycopg://user@host/db``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest

from fencepost.cli import cli
from tests._docs import python_blocks, shell_blocks

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
_SEPARATORS = {"&&", "||", ";", "|"}


def shell_commands(page: Path) -> list[list[str]]:
    """The ``fencepost ...`` commands of the page's shell blocks, split as the shell would."""
    commands = []
    for block in shell_blocks(page):
        for line in block.replace("\\\n", " ").splitlines():
            words: list[str] = []
            for word in [*shlex.split(line, comments=True), "&&"]:
                if word in _SEPARATORS or word.startswith((">", "<")):
                    if words[:1] == ["fencepost"]:
                        commands.append(words[1:])
                    words = []
                else:
                    words.append(word)
    return commands


def parse(args: list[str]) -> click.Command:
    """Parse ``fencepost ARGS`` down to its leaf command (raises click's usage errors); run nothing."""
    cmd: click.Command = cli
    ctx = cli.make_context("fencepost", list(args))
    while isinstance(cmd, click.Group):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            break
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        cmd = sub
    return cmd


def test_every_page_with_a_python_sample_has_a_test_that_runs_it():
    runners = [path.read_text(encoding="utf-8") for path in (ROOT / "tests").rglob("test_*.py")]
    runners = [text for text in runners if "run_snippets(" in text or "python_blocks(" in text]
    untested = [str(page.relative_to(ROOT)) for page in PAGES
                if python_blocks(page) and not any(f'"{page.name}"' in text for text in runners)]
    assert untested == [], "run these pages' samples in a test (tests/_docs.py: run_snippets)"


CASES = [(page, args) for page in PAGES for args in shell_commands(page)]


def test_the_docs_have_commands_to_check():
    assert len(CASES) >= 20
    pages = {page.name for page, _args in CASES}
    assert {"README.md", "demo.md", "shards.md", "ui.md", "cli.md"} <= pages


@pytest.mark.parametrize(("page", "args"), CASES,
                         ids=[f"{p.relative_to(ROOT)}: {' '.join(a)[:60]}" for p, a in CASES])
def test_every_documented_command_line_parses(page, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FENCEPOST_DB", raising=False)
    for i, word in enumerate(args[:-1]):
        if word == "--shards":  # a file of stores the page's reader has written
            (tmp_path / args[i + 1]).write_text("sqlite:///a.db\nsqlite:///b.db\n")
    try:
        parse(args)
    except click.UsageError as exc:
        pytest.fail(f"{page.name}: `fencepost {shlex.join(args)}`: {exc.format_message()}")


@pytest.mark.parametrize("args", [["runs", "list", "--stauts", "failed"], ["runs", "lsit"],
                                  ["--bd", "x", "init"], ["worker", "-n", "0", "--task", "m:f"]])
def test_the_check_catches_a_misspelled_command_or_option(args):
    with pytest.raises(click.UsageError):
        parse(args)
