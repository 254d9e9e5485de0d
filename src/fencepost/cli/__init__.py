"""The ``fencepost`` command line: each command parses, makes one library call and renders.

One error boundary (``main``): a ``FencepostError``, a database failure or a bad argument prints one
line on stderr and exits non-zero, never a traceback (set ``FENCEPOST_DEBUG=1`` to see one). Exit
codes: 0 ok, 1 failure, 2 usage, 130 interrupted. A group given no command prints its help. Read
commands open the database read-only and never create or migrate it; every one takes
``--format table|json|jsonl|csv`` (``--json`` for short), rendered by ``cli._output``.
"""

from __future__ import annotations

import os
import sys

import click

from fencepost.cli._common import CliContext, echo_error, error_text, parse_db, read_shard_file
from fencepost.cli._output import redacted_first_line
from fencepost.cli.demo import demo
from fencepost.cli.feed import feed, source
from fencepost.cli.journal import journal
from fencepost.cli.migrations import migrations
from fencepost.cli.projection import projection
from fencepost.cli.runs import init, runs
from fencepost.cli.ui import ui
from fencepost.cli.worker import worker

__all__ = ["cli", "main"]


class _Fencepost(click.Group):
    """The top group: Ctrl-C while a command works exits 130 without a word.

    Left to click, the ``KeyboardInterrupt`` became ``Abort`` after a blank line on stderr, and the
    boundary printed ``Error: aborted``: an interruption the user asked for is not an error, and a
    follower, the worker and a Ctrl-C while the command starts already exit quietly. A command
    with something to say about what the stop left behind (the worker's table, the demo's parked
    runs) says it itself. The context (and so the store) is still closed on the way out.
    """

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise SystemExit(130) from None


@click.group(cls=_Fencepost, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--db", "dbs", multiple=True, metavar="[NAME=]URL",
              help="Database URL: sqlite:///relative/path.db, sqlite:////absolute/path.db (four "
                   "slashes) or postgresql+psycopg://user@host/database. Default: $FENCEPOST_DB, else "
                   "sqlite:///.flows/flows.db. A password given here shows in the process list (ps): put it "
                   "in $FENCEPOST_DB, --shards FILE, a libpq password file or PGPASSWORD instead. Repeat it "
                   "to work across "
                   "several stores (runs list, feed tail; the other commands route by run id through "
                   "a shard set, or refuse); NAME= labels a store (default: the shard name it recorded, "
                   "else shard-<i>).")
@click.option("--shards", "shard_file", metavar="FILE", default=None,
              help="Read the stores from a file instead: one URL or NAME=URL a line (# starts a comment, "
                   "at the start of a line or after a space). Holding a password, it should be private (chmod 600): "
                   "one others may read gets a warning.")
@click.version_option(package_name="fencepost")
@click.pass_context
def cli(ctx: click.Context, dbs: tuple[str, ...], shard_file: str | None) -> None:
    """Durable run state: runs, their journal, the change feed and projections.

    Example: fencepost demo && fencepost runs list --status completed
    """
    if shard_file is not None and dbs:
        raise click.UsageError("--db and --shards are exclusive: give the stores one way")
    if shard_file is not None:
        ctx.obj = CliContext(None, read_shard_file(shard_file))
    elif len(dbs) > 1:
        ctx.obj = CliContext(None, [parse_db(value, f"--db #{i}") for i, value in enumerate(dbs, start=1)])
    else:
        # One --db (or $FENCEPOST_DB, or the default): exactly as before, unless given as NAME=URL.
        spec = parse_db(dbs[0], "--db") if dbs else None
        ctx.obj = CliContext(None, [spec]) if spec is not None and spec.name else CliContext(dbs[0] if dbs else None)
    ctx.call_on_close(ctx.obj.close)


cli.add_command(init)
cli.add_command(demo)
cli.add_command(runs)
cli.add_command(journal)
cli.add_command(feed)
cli.add_command(source)
cli.add_command(projection)
cli.add_command(worker)
cli.add_command(ui)
cli.add_command(migrations)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: the single error boundary of every command."""
    from fencepost._durable import DbFailure
    from fencepost.errors import FencepostError

    no_args_help = getattr(click.exceptions, "NoArgsIsHelpError", ())
    if sys.stdout is None:  # started with its output closed (``>&-``): refuse before doing anything
        echo_error("standard output is closed: the command has nowhere to write (send it to /dev/null "
                   "to discard what it prints); nothing was done")
        sys.exit(2)
    try:
        code = cli.main(args=argv, prog_name="fencepost", standalone_mode=False)
    except no_args_help as exc:  # a bare group (click >= 8.2 raises this): its normal help, exit 0
        click.echo(exc.ctx.get_help())
        sys.exit(0)
    except click.exceptions.Abort as exc:
        if not isinstance(exc.__cause__, KeyboardInterrupt):  # Ctrl-C while parsing: quiet, as later
            echo_error("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        # Usage errors: click's own message on one line, exit 2; a command's failure, exit 1.
        echo_error(exc.format_message() + _placement_hint(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except FencepostError as exc:
        _debug()
        echo_error(error_text(exc))
        sys.exit(2 if exc.code in _USAGE_CODES else 1)
    except DbFailure as exc:
        _debug()
        echo_error(f"database failure: {exc}")
        sys.exit(1)
    except Exception as exc:  # the boundary: never a traceback for the user
        _debug()
        echo_error(f"{type(exc).__name__}: {redacted_first_line(exc, 'unexpected error')}")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


# The options of ``fencepost`` itself, which a command's --help does not list, with their metavar.
_GROUP_OPTIONS = {"--db": "URL", "--shards": "FILE"}


def _placement_hint(exc: click.ClickException) -> str:
    """Where a group option given after the command goes (``runs list --db URL``): click only said
    there is no such option, which a reader of ``fencepost --help`` could not make sense of."""
    name = getattr(exc, "option_name", None)
    ctx = getattr(exc, "ctx", None)
    if not isinstance(exc, click.NoSuchOption) or name not in _GROUP_OPTIONS or ctx is None:
        return ""
    command = ctx.command_path.partition(" ")[2]
    return (f" ({name} is an option of fencepost itself: give it before the command, "
            f"as in fencepost {name} {_GROUP_OPTIONS[name]} {command})")


# Refusals of a value the user typed (a --cursor that is not this listing's): usage errors.
_USAGE_CODES = frozenset({"invalid_cursor"})


def _debug() -> None:
    if os.environ.get("FENCEPOST_DEBUG") == "1":
        import traceback

        traceback.print_exc()
