"""``fencepost projection run|status|rebuild``."""

from __future__ import annotations

import signal
import threading
from typing import Any

import click

from fencepost.cli._common import CliContext, console, json_option, print_json, read_store, table

PROJECTIONS = ("runs-by-status", "ownership-history")


def make_projection(name: str) -> Any:
    from fencepost.projections import OwnershipHistory, RunsByStatus

    return RunsByStatus() if name == "runs-by-status" else OwnershipHistory()


def _options(fn):
    fn = click.option("--target", metavar="URL", default=None,
                      help="Database holding the projection (default: the source database itself).")(fn)
    fn = click.option("--name", "which", type=click.Choice(PROJECTIONS), default="runs-by-status",
                      show_default=True, help="Which built-in projection.")(fn)
    return fn


def _builder(obj: CliContext, which: str, target: str | None, *, readonly_target: bool = False) -> Any:
    from fencepost._durable import Database
    from fencepost.projections import ProjectionBuilder

    source = read_store()
    url = target or obj.resolved_url
    target_db: Any = Database(url, readonly=True) if readonly_target else url
    return ProjectionBuilder(source, target_db, make_projection(which), lock_timeout=5.0)


@click.group()
def projection() -> None:
    """Build and inspect read-model projections fed by the change feed."""


@projection.command("run")
@_options
@click.option("--follow", "-f", is_flag=True, help="Keep following the feed until interrupted.")
@json_option
@click.pass_obj
def projection_run(obj: CliContext, which: str, target: str | None, follow: bool, as_json: bool) -> None:
    """Catch the projection up with the source (or keep it in step with --follow).

    Example: fencepost projection run --name runs-by-status
    """
    with _builder(obj, which, target) as builder:
        if follow:
            stop = threading.Event()
            previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
            try:
                builder.run(stop)
            except KeyboardInterrupt:
                pass
            finally:
                signal.signal(signal.SIGTERM, previous)
            return
        result = builder.catch_up()
    if as_json:
        print_json(result)
    else:
        console.print(f"applied {result.applied}, rejected {result.rejected}, "
                      f"{'rebuilt, ' if result.rebuilt else ''}at revision {result.revision}")


@projection.command("status")
@_options
@json_option
@click.pass_obj
def projection_status(obj: CliContext, which: str, target: str | None, as_json: bool) -> None:
    """Show where a projection stands against its source (applied revision, lag, rejections).

    Example: fencepost projection status --json
    """
    # Read-only on both sides: a target never built reports the whole source as lag, creating nothing.
    with _builder(obj, which, target, readonly_target=True) as builder:
        try:
            status = builder.status()
        finally:
            builder.target.dispose()
    if as_json:
        print_json(status)
        return
    table(f"projection {status.name}", ["field", "value"],
          [(f, getattr(status, f)) for f in status.__struct_fields__])


@projection.command("rebuild")
@_options
@json_option
@click.pass_obj
def projection_rebuild(obj: CliContext, which: str, target: str | None, as_json: bool) -> None:
    """Rebuild the projection from revision 0 of the current source.

    Example: fencepost projection rebuild --name ownership-history
    """
    with _builder(obj, which, target) as builder:
        result = builder.rebuild()
    if as_json:
        print_json(result)
    else:
        console.print(f"rebuilt: applied {result.applied} at revision {result.revision}")
