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


# ------------------------------------------------------------------ examples a user can copy
def _examples() -> dict[str, list[list[str]]]:
    """Each leaf command's Example line, as the commands (argv after ``fencepost``) it chains."""
    import shlex

    found = {}
    for full, cmd, _ctx in iter_commands(cli):
        if isinstance(cmd, click.Group):
            continue
        line = next(t for t in cmd.help.splitlines() if t.strip().startswith("Example:"))
        steps = [shlex.split(part) for part in line.split("Example:", 1)[1].split("&&")]
        found[full] = [s[1:] for s in steps if s and s[0] == "fencepost"]
    return found


def _run_id_args(full: str, argv: list[str]) -> list[str]:
    """The RUN_ID arguments of one example command (``argv`` after ``fencepost``)."""
    from fencepost.cli._common import RunIdType

    cmd = cli
    ctx = click.Context(cli)
    for word in argv:
        if not isinstance(cmd, click.Group) or cmd.get_command(ctx, word) is None:
            break
        cmd = cmd.get_command(ctx, word)
        argv = argv[1:]
    names = [p for p in cmd.params if isinstance(p, click.Argument) and isinstance(p.type, RunIdType)]
    if not names:
        return []
    positional = [w for w in argv if not w.startswith("-")]
    # Run-id commands take only run ids as positionals (options' values here are --format's).
    return [w for w in positional if w not in ("json", "jsonl", "csv", "table")]


def test_every_run_an_example_names_is_one_it_creates():
    """Examples named ``demo-0001``; the demo names its runs ``demo-<batch>-NNNN``, so a user who
    ran the demo and copied an example got "not found". Every run an example reads or acts on is
    made by a ``runs create`` in the same example, or by the ``runs create`` example itself."""
    examples = _examples()
    created_by_create_example = {a for argv in examples["fencepost runs create"] for a in argv[2:3]}
    for full, steps in examples.items():
        created = set(created_by_create_example)
        for argv in steps:
            ids = _run_id_args(full, argv)
            if argv[:2] == ["runs", "create"]:
                created.update(ids)
                continue
            if argv[:2] == ["feed", "snapshot"]:
                # A snapshot reports an unknown id as Missing (the example shows one): one must exist.
                assert set(ids) & created, f"{full}: example names no run that something creates"
                continue
            assert set(ids) <= created, f"{full}: example names runs {sorted(set(ids) - created)} nothing creates"


def test_the_examples_that_create_their_runs_work_as_written(db_url: str, run_cli_in_process, tmp_path):
    run_cli = run_cli_in_process  # each example's command line through main(), as the script runs it
    env = {"FENCEPOST_DB": db_url}
    assert run_cli("init", env=env).code == 0
    tried = 0
    for full, steps in _examples().items():
        if not any(argv[:2] == ["runs", "create"] for argv in steps) or full == "fencepost runs create":
            continue
        tried += 1
        for argv in steps:
            if argv[:2] == ["runs", "create"]:
                run_cli("runs", "delete", argv[2], env=env)  # made by an earlier example
            result = run_cli(*argv, env=env)
            assert result.code == 0, (full, argv, result)
    assert tried >= 5
