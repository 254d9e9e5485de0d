"""Render ``docs/cli.md`` from the commands' own ``--help`` (a test keeps the page current).

Regenerate with ``python -m fencepost.cli._docs > docs/cli.md``.
"""

from __future__ import annotations

import click

HEADER = """# Command line reference

<!-- Generated from `fencepost --help` by `python -m fencepost.cli._docs > docs/cli.md`.
     Do not edit by hand: tests/cli/test_docs.py fails when this page and the help drift apart. -->

Every command takes the group option `--db URL` (or `$FENCEPOST_DB`; default
`sqlite:///.flows/flows.db`). Read commands open the database read-only and never create or
migrate it; `--json` prints the library's own structs. Errors are one line on stderr with a
non-zero exit. See also the guides: [worker](guides/worker.md), [demo](guides/demo.md).
"""


def iter_commands(group: click.Group, prefix: str = "fencepost", parent: click.Context | None = None):
    """Yield ``(full name, command, context)`` for the group and every command under it, sorted."""
    ctx = click.Context(group, info_name=prefix.split()[-1], parent=parent, terminal_width=100,
                        help_option_names=["-h", "--help"],
                        max_content_width=100)
    yield prefix, group, ctx
    for name in sorted(group.list_commands(ctx)):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        full = f"{prefix} {name}"
        if isinstance(cmd, click.Group):
            yield from iter_commands(cmd, full, ctx)
        else:
            yield full, cmd, click.Context(cmd, info_name=name, parent=ctx, terminal_width=100,
                                           help_option_names=["-h", "--help"], max_content_width=100)


def render() -> str:
    """The whole page."""
    from fencepost.cli import cli

    parts = [HEADER]
    for full, cmd, ctx in iter_commands(cli):
        level = "##" if full == "fencepost" or isinstance(cmd, click.Group) else "###"
        parts.append(f"\n{level} `{full}`\n\n```text\n{cmd.get_help(ctx).rstrip()}\n```\n")
    return "".join(parts)


if __name__ == "__main__":
    import sys

    sys.stdout.write(render())
