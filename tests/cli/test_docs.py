"""docs/cli.md is generated from --help; these tests keep it, and the help texts, current."""

from __future__ import annotations

from pathlib import Path

import click

from fencepost.cli import cli
from fencepost.cli._docs import iter_commands, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_cli_reference_matches_the_help_text():
    assert DOC.read_text() == render(), "regenerate: python -m fencepost.cli._docs > docs/cli.md"


def test_every_command_has_help_and_leaf_commands_show_an_example():
    for full, cmd, _ctx in iter_commands(cli):
        assert (cmd.help or "").strip(), f"{full} has no help text"
        if not isinstance(cmd, click.Group):
            assert "Example:" in cmd.help, f"{full} has no Example: line"


def test_every_read_command_offers_every_format_and_the_json_alias():
    writers = {"fencepost init", "fencepost demo", "fencepost worker"}
    servers = {"fencepost ui"}  # serves HTML pages (its health is also at /health.json), prints nothing to parse
    for full, cmd, _ctx in iter_commands(cli):
        if isinstance(cmd, click.Group) or full in writers | servers:
            continue
        params = {p.name: p for p in cmd.params}
        assert "as_json" in params, f"{full} lacks --json"
        assert "output_format" in params, f"{full} lacks --format"
        assert list(params["output_format"].type.choices) == ["table", "json", "jsonl", "csv"], full


def test_the_spec_command_set_is_present():
    names = {full for full, _cmd, _ctx in iter_commands(cli)}
    for required in ("init", "demo", "runs list", "runs show", "runs cancel", "journal show", "journal replay",
                     "journal verify", "feed tail", "feed snapshot", "source show", "source rotate",
                     "projection run", "projection status", "projection rebuild", "worker"):
        assert f"fencepost {required}" in names
