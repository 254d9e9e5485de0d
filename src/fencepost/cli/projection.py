"""``fencepost projection run|status|rebuild``."""

from __future__ import annotations

import threading
import time
from typing import Any

import click

from fencepost.cli._common import CliContext, read_store, stop_on_signals
from fencepost.cli._output import Output, output_options, to_data

# The names ``projection status`` shows; the dashed spellings are accepted too.
PROJECTIONS = ("runs_by_status", "ownership_history")


class ProjectionName(click.ParamType):
    """A built-in projection, by the name ``projection status`` shows (``-`` or ``_`` alike)."""

    name = "|".join(PROJECTIONS)

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        name = str(value).strip().replace("-", "_")
        if name not in PROJECTIONS:
            self.fail(f"must be one of {', '.join(PROJECTIONS)}", param, ctx)
        return name


def make_projection(name: str) -> Any:
    from fencepost.projections import OwnershipHistory, RunsByStatus

    return RunsByStatus() if name == "runs_by_status" else OwnershipHistory()


def _options(fn):
    fn = click.option("--target", metavar="URL", default=None,
                      help="Database holding the projection (default: the source database itself).")(fn)
    fn = click.option("--name", "which", type=ProjectionName(), default="runs_by_status",
                      show_default=True, help="Which built-in projection (the name projection status shows).")(fn)
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
@click.option("--follow", "-f", is_flag=True,
              help="Keep following the feed until stopped (Ctrl-C exits 130, SIGTERM exits 0).")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=2.0, show_default=True,
              help="With --follow: seconds between status lines.")
@output_options
@click.pass_obj
def projection_run(obj: CliContext, which: str, target: str | None, follow: bool, interval: float,
                   out: Output) -> None:
    """Catch the projection up with the source (or keep it in step with --follow).

    With --follow, prints a status line every --interval seconds: the position the projection
    reflects, its lag and the updates applied per second (json/jsonl: one object per line with
    the projection status fields and applied_per_s).

    Example: fencepost projection run --name runs_by_status --follow
    """
    with _builder(obj, which, target) as builder:
        if follow:
            _follow(obj, builder, which, target, interval, out)
            return
        result = builder.catch_up()
    if out.is_table:
        out.message(f"applied {result.applied}, rejected {result.rejected}, "
                    f"{'rebuilt, ' if result.rebuilt else ''}at revision {result.revision}")
    else:
        out.record(to_data(result))


def _follow(obj: CliContext, builder: Any, which: str, target: str | None, interval: float, out: Output) -> None:
    """Run the builder in a thread; the main thread handles signals and prints status lines."""
    failure: list[BaseException] = []

    def work(stop: threading.Event) -> None:
        try:
            builder.run(stop)
        except BaseException as exc:  # handed to the main thread, raised there
            failure.append(exc)
        finally:
            stop.set()

    emit = out.stream([])
    with stop_on_signals() as stop, _builder(obj, which, target, readonly_target=True) as watcher:
        thread = threading.Thread(target=work, args=(stop,), name=f"projection-{which}", daemon=True)
        thread.start()
        try:
            last: tuple[float, int] | None = None
            while not stop.wait(interval if last is not None else min(interval, 0.5)):
                status = watcher.status()
                now = time.monotonic()
                rate = 0.0 if last is None else (status.applied - last[1]) / max(now - last[0], 1e-9)
                last = (now, status.applied)
                if out.is_table:
                    emit_line(status, rate)
                else:
                    emit({**to_data(status), "applied_per_s": round(rate, 1)})
        finally:
            stop.set()
            thread.join()
            watcher.target.dispose()
    if failure:
        raise failure[0]


def emit_line(status: Any, rate: float) -> None:
    """One status line: position (source:revision), lag and applied updates per second."""
    source = status.source[:8] if status.source else "-"
    click.echo(f"{status.name}  position {source}:{status.applied_revision}  lag {status.lag}  "
               f"applied/s {rate:.1f}" + (f"  rebuilding ({status.pending_rebuild})" if status.pending_rebuild else ""))


@projection.command("status")
@_options
@output_options
@click.pass_obj
def projection_status(obj: CliContext, which: str, target: str | None, out: Output) -> None:
    """Show where a projection stands against its source (applied revision, lag, rejections).

    Example: fencepost projection status --format json
    """
    # Read-only on both sides: a target never built reports the whole source as lag, creating nothing.
    with _builder(obj, which, target, readonly_target=True) as builder:
        try:
            status = builder.status()
        finally:
            builder.target.dispose()
    out.record(to_data(status), title=f"projection {status.name}")


@projection.command("rebuild")
@_options
@output_options
@click.pass_obj
def projection_rebuild(obj: CliContext, which: str, target: str | None, out: Output) -> None:
    """Rebuild the projection from revision 0 of the current source.

    Example: fencepost projection rebuild --name ownership_history
    """
    with _builder(obj, which, target) as builder:
        result = builder.rebuild()
    if out.is_table:
        out.message(f"rebuilt: applied {result.applied} at revision {result.revision}")
    else:
        out.record(to_data(result))
