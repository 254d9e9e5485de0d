"""Render ``docs/cli.md`` from the commands' own ``--help`` (a test keeps the page current).

Regenerate with ``python -m fencepost.cli._docs > docs/cli.md``.
"""

from __future__ import annotations

import click

HEADER = """# Command line reference

<!-- Generated from `fencepost --help` by `python -m fencepost.cli._docs > docs/cli.md`.
     Do not edit by hand: tests/cli/test_docs.py fails when this page and the help drift apart. -->

Every command takes the group option `--db URL` (or `$FENCEPOST_DB`; default
`sqlite:///.flows/flows.db`). A SQLite file is `sqlite:///relative/path.db` (relative to the working
directory) or `sqlite:////absolute/path.db` (four slashes); a plain path is refused with those
forms. Read commands open the database read-only and never create or migrate it. A group given no
command (`fencepost`, `fencepost runs`) prints its help.

**Passwords.** A command line is visible to every user of the machine (`ps`), so a PostgreSQL
password written in `--db` is too. Keep it out: put the URL in `$FENCEPOST_DB` (several stores: a
`--shards FILE` readable only by you), or leave the password out of the URL and let libpq find it
in a password file (`~/.pgpass`, or `?passfile=PATH`) or `$PGPASSWORD`.

**Several stores.** Repeat `--db` (or name a file of stores with `--shards FILE`, one `URL` or
`NAME=URL` a line) to work across stores. `runs list` and `feed tail` read any stores (every shard of a set,
independent stores, or both; some shards of a set but not all are refused, since the listing
would look complete; one `--db` alone reads that one store, a shard included) and label
every record with its store (`store`, the first column): the name given as `NAME=URL`, else the
shard name the store recorded as part of a shard set, else `shard-0`, `shard-1` ... by position.
`runs show`, `runs cancel`, `runs delete`, `runs create ID` and `journal show|replay ID` need the
stores to be one shard set (every shard of it) and act on the run's shard; `init` founds a set on
empty stores and `worker` sweeps every shard of it. Other commands work on one store and refuse
several (exit 2).

```sh
fencepost --db sqlite:///a.db --db sqlite:///b.db init            # found a shard set of two
fencepost --db edge=sqlite:///edge.db --db central=postgresql+psycopg://host/db runs list
fencepost --shards stores.txt feed tail --follow --format jsonl
```

**Output formats.** Every read command takes `--format table|json|jsonl|csv` (`--json` is short for
`--format json`). `table` is for people: on a terminal a drawn table, written to a pipe or a file
plain aligned columns with one record per line, never folded, so `fencepost runs list | grep ID`
finds the run. `json` prints one document, `jsonl` one object per line, `csv` a header and one row
per record (nested values as JSON text, booleans `true`/`false`, none an empty cell). Keys are
snake_case throughout; what a user recorded (a run's `state`, a journal entry's `payload` and
`meta`) is shown exactly as it was written. A run carries `state`, its `state_json` decoded, beside
the verbatim `state_json`. A table (and a `feed tail` line, a sentence such as `created ID`) shows a
control character the text holds (ESC, BEL, ...) as `\\xNN`, and an invisible format character (a
right-to-left override, a zero-width space, a byte order mark, ...) as `\\uNNNN`, so a run id or
flow name never drives the terminal nor shows as another; the other formats keep the exact text.

**Progress.** `journal verify`, `journal replay --all`, `projection rebuild` and `projection run`
(without `--follow`) draw a progress bar on stderr while they work (entries, runs or revisions done
of the total), and only when stderr is a terminal: on a pipe or a file, and so for a script or a
`--format json` consumer, stdout and stderr are exactly what they would be without it. The bar is
gone before the result prints; `--no-progress` draws none on a terminal either. Ctrl-C stops the
command (exit 130); a projection resumes from the last page it committed.

**Errors and exit codes.** An error is one line on stderr starting with `Error:`, never a
traceback (set `FENCEPOST_DEBUG=1` to see one); data goes to stdout. Ctrl-C is no error: the
command exits 130 without an `Error:` line (`worker` still prints its table, `demo` a line saying its
workers were stopped).

| exit code | meaning |
|---|---|
| 0 | success |
| 1 | failure: the command ran and failed (unknown run, unreachable database, a broken journal) |
| 2 | usage: a bad option, argument, command or `--db` URL (or URL option); nothing was changed |
| 130 | interrupted: stopped with Ctrl-C, even while starting (SIGTERM stops a follower gracefully with 0) |

A command whose output pipe closes (`| head -3` has read what it wanted) stops and exits 1 without a
word. A follower (`feed tail --follow`, `projection run --follow`) notices at once, even on a quiet
store where it has nothing more to write. When stderr is the pipe that closed (a log reader that went
away), what the command still had to say there is dropped and it goes on: its output, its work and
its exit code are as they would have been.

See also the guides: [worker](guides/worker.md), [demo](guides/demo.md).
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
