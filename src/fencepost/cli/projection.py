"""``fencepost projection run|status|rebuild``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from fencepost._printable import one_line
from fencepost.cli._common import (
    CliContext,
    FiniteRange,
    _checked_url,
    fail,
    progress_bar,
    progress_option,
    read_store,
    stop_on_signals,
)
from fencepost.cli._output import Column, Output, output_options, to_data

# The names ``projection status`` shows; the dashed spellings are accepted too.
PROJECTIONS = ("runs_by_status", "ownership_history")


class ProjectionName(click.ParamType):
    """A built-in projection, by the name ``projection status`` shows (``-`` or ``_`` alike)."""

    name = "|".join(PROJECTIONS)

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        name = str(value).strip().lower().replace("-", "_")
        if name not in PROJECTIONS:
            self.fail(f"must be one of {', '.join(PROJECTIONS)}", param, ctx)
        return name


class StatusName(ProjectionName):
    """What ``projection status --name`` takes: a built-in projection (as ``ProjectionName``), else
    any projection name, kept exactly as given, to be looked up among those checkpointed on the target."""

    name = "NAME"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from fencepost._values import identifier_problem

        builtin = str(value).strip().lower().replace("-", "_")
        if builtin in PROJECTIONS:
            return builtin
        problem = identifier_problem(value)
        if problem:
            self.fail(problem, param, ctx)
        return str(value)


def make_projection(name: str) -> Any:
    from fencepost.projections import OwnershipHistory, RunsByStatus

    return RunsByStatus() if name == "runs_by_status" else OwnershipHistory()


def _checked_target(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--target`` is checked as ``--db`` is: a bad URL is a usage error, before anything opens."""
    return None if value is None else _checked_url(value, "--target")


def _options(fn=None, *, status: bool = False):
    if fn is None:
        return lambda f: _options(f, status=status)
    fn = click.option("--target", metavar="URL", default=None, callback=_checked_target,
                      help="Database holding the projection (default: the source database itself; "
                           "required with several --db).")(fn)
    if status:
        fn = click.option("--name", "which", type=StatusName(), metavar=StatusName.name, default="runs_by_status",
                          show_default=True,
                          help="Which projection: a built-in one (runs_by_status or ownership_history, dashes "
                               "or underscores alike), or any other projection with a checkpoint on the target, "
                               "by its exact name (one you built with ProjectionBuilder; one fed by several "
                               "stores is shown when each is given as --db NAME=URL).")(fn)
        return fn
    fn = click.option("--name", "which", type=ProjectionName(), metavar=ProjectionName.name, default="runs_by_status",
                      show_default=True, help="Which built-in projection (dashes or underscores alike). A projection "
                                              "of your own is run by its ProjectionBuilder, not from here.")(fn)
    return fn


def _builder(obj: CliContext, which: str, target: str | None, *, readonly_target: bool = False) -> Any:
    """One store: the builder of today. Several ``--db`` (or one named ``NAME=URL``): one read model
    fed by every store, one checkpoint per store, rows keyed by the store's name."""
    from fencepost.projections import ProjectionBuilder

    if obj.labelled:
        if target is None:
            raise click.UsageError("with several stores, name the database that holds the read model: --target URL")
        source: Any = obj.stores(readonly=True)
        url = target
    else:
        source = read_store()
        url = target or obj.resolved_url
    target_db: Any = _readonly_target(url) if readonly_target else url
    return ProjectionBuilder(source, target_db, make_projection(which), lock_timeout=5.0)


@contextmanager
def _busy_explained(which: str) -> Iterator[None]:
    """``builder_busy`` (another builder held the name for the 5 s the command waits) said as what to
    do from the command line; the library's advice (``lock_timeout``) is no option here."""
    from fencepost.errors import ProjectionError

    try:
        yield
    except ProjectionError as exc:
        if exc.code != "builder_busy":
            raise
        where = exc.target if exc.target is not None else "its target"
        raise fail(f"another builder is applying projection {which} on {where} (a fencepost projection run "
                   f"--follow, a fencepost demo, or an application's ProjectionBuilder): stop it first, then "
                   f"run this command again") from None


@contextmanager
def _replacement_explained(builder: Any) -> Iterator[None]:
    """A SQLite source (or target) file replaced or removed under ``run --follow``: say what happened
    and what to do from the command line (run it again), not the library's "reopen the store" or
    "make a new ProjectionBuilder" (exit 1).

    Running again is what the library means: the new command opens the file now at the path, and
    the builder rebuilds from it (a target elsewhere holds the old file's source, so it sees
    ``source_changed``; a projection kept in the source file itself is built anew in the new one).
    A removed file is said as removed (running again would find no database there). Only
    SQLite: a PostgreSQL schema has no file to replace, its next connection sees a new one and the
    builder rebuilds on its own."""
    from pathlib import Path

    from fencepost._dialects import FILE_REPLACED
    from fencepost.errors import ProjectionError

    try:
        yield
    except ProjectionError as exc:
        if getattr(exc, "db_code", None) == FILE_REPLACED and builder.target.path is not None:
            target = Path(str(builder.target.path))
            if target.exists():
                raise fail(f"the projection's target {target} was replaced while the projection followed it: "
                           f"run this command again to build the projection onto the database now at that "
                           f"path") from None
            raise fail(f"the projection's target {target} was removed while the projection followed it: run "
                       f"this command again to build the projection anew in a new file at that path") from None
        if not exc.source_replaced:
            raise
        store = builder.source if exc.store is None else builder.sources[exc.store]
        path = Path(str(store.db.path))
        which = "the source database" if exc.store is None else f"store {exc.store}: its database"
        if path.exists():
            raise fail(f"{which} {path} was replaced while the projection followed it: run this command again "
                       f"to follow the database now at that path (the projection is rebuilt from it)") from None
        raise fail(f"{which} {path} was removed while the projection followed it: put a database back at that "
                   f"path, then run this command again (the projection is rebuilt from it)") from None


def _readonly_target(url: str) -> Any:
    """The target opened read-only. A SQLite file that is not there, or a PostgreSQL schema that is
    not, is named as the projection's target (``database_missing``) rather than read as a
    projection never built: a mistyped name would otherwise look like a real, empty read model (and
    the store's advice, ``fencepost init``, would make a store of it)."""
    from pathlib import Path

    from fencepost._durable import Database, DbFailure, open_detail, parse_url
    from fencepost.errors import DatabaseMissing, ProjectionError

    advice = "; build the projection there first (`fencepost projection run --target URL`)"
    try:
        db = Database(url, readonly=True)
    except DatabaseMissing:
        where = str(Path(parse_url(url)[0].database or ""))
        raise ProjectionError("database_missing", "status", "projection target: " + open_detail(
            "database_missing", where, sqlite=False) + advice) from None
    try:
        missing = db.missing_namespace() if db.schema is not None and db.connect_problem() is None else None
    except DbFailure:
        missing = None  # unreadable for another reason: the builder's first read says why
    if missing is not None:
        db.dispose()
        raise ProjectionError("database_missing", "status", f"projection target: {missing}{advice}")
    return db


def _per_store(result: Any) -> list[dict[str, Any]]:
    """A result of one store as one record; a result of several as one record per store, labelled."""
    if isinstance(result, dict):
        return [{"store": name, **to_data(value)} for name, value in result.items()]
    return [to_data(result)]


_STORE = Column("store", "store", wrap=False)
_STATUS_COLUMNS = [_STORE, *(Column(k, k) for k in ("source", "applied_revision", "source_revision", "lag",
                                                     "applied", "rejected", "rebuilds", "pending_rebuild"))]


@click.group()
def projection() -> None:
    """Build and inspect read-model projections fed by the change feed."""


@projection.command("run")
@_options
@click.option("--follow", "-f", is_flag=True,
              help="Keep following the feed until stopped (Ctrl-C exits 130, SIGTERM exits 0, its output "
                   "pipe closing exits 1).")
@click.option("--interval", type=FiniteRange(0.1, 3600), default=2.0, show_default=True,
              help="With --follow: seconds between status lines.")
@progress_option
@output_options
@click.pass_obj
def projection_run(obj: CliContext, which: str, target: str | None, follow: bool, interval: float,
                   out: Output, progress: bool) -> None:
    """Catch the projection up with the source (or keep it in step with --follow).

    Without --follow, a progress bar on stderr (when it is a terminal) shows the revision reached
    of the source's head. With --follow, prints a status line every --interval seconds: the
    position the projection reflects, its lag and the updates applied per second (json/jsonl: one
    object per line with the projection status fields and applied_per_s), and a line each time a
    rebuild starts (the source rotated or rewound, a table of the projection was dropped on the
    target). A database that stops answering is waited out: stderr says when the status became
    unavailable and when it is available again.

    Example: fencepost projection run --name runs_by_status --follow
    """
    ctx = click.get_current_context()
    if not follow and ctx.get_parameter_source("interval") is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--interval needs --follow (a single catch-up prints one result)")
    with _busy_explained(which), _builder(obj, which, target) as builder:
        if follow:
            with _replacement_explained(builder):
                _follow(obj, builder, which, target, interval, out)
            return
        with progress_bar(f"catching up {which}", enabled=progress) as on_progress:
            result = builder.catch_up(on_progress=on_progress)
    if isinstance(result, dict):
        records = _per_store(result)
        if out.is_table:
            for r in records:
                out.message(f"{r['store']}: applied {r['applied']}, rejected {r['rejected']}, "
                            f"{'rebuilt, ' if r['rebuilt'] else ''}at revision {r['revision']}")
        else:
            out.rows(records, [])
    elif out.is_table:
        out.message(f"applied {result.applied}, rejected {result.rejected}, "
                    f"{'rebuilt, ' if result.rebuilt else ''}at revision {result.revision}")
    else:
        out.record(to_data(result))


def _follow(obj: CliContext, builder: Any, which: str, target: str | None, interval: float, out: Output) -> None:
    """Run the builder in a thread; the main thread handles signals and prints status lines."""
    from fencepost.errors import FencepostError
    from fencepost.projections.builder import worth_waiting

    failure: list[BaseException] = []

    def work(stop: threading.Event) -> None:
        try:
            builder.run(stop)
        except BaseException as exc:  # handed to the main thread, raised there
            failure.append(exc)
        finally:
            stop.set()

    emit = out.stream([])
    if out.is_table:
        # Every rebuild the builder begins gets a line of its own, a dropped live table's too: the
        # status lines name a rebuild only while one is pending when they are sampled.
        def rebuilding(store: str | None, reason: str) -> None:
            label = f"{store}  " if store is not None else ""
            why = ": a table of the projection was missing on the target" if reason == "table_missing" else ""
            click.echo(f"{label}{builder.name}  rebuild started ({reason}){why}")

        builder._on_rebuild = rebuilding
    builder._prepare()  # create the target first: the read-only watcher below must find it
    with stop_on_signals(output=True) as stop, _builder(obj, which, target, readonly_target=True) as watcher:
        thread = threading.Thread(target=work, args=(stop,), name=f"projection-{which}", daemon=True)
        thread.start()
        try:
            last: dict[str, tuple[float, int]] = {}
            unavailable = False
            while not stop.wait(interval if last else min(interval, 0.5)):
                try:
                    found = watcher.status()
                except FencepostError as exc:
                    # The builder thread waits an unavailable database out: so does its status line.
                    if not worth_waiting(exc):
                        raise
                    if not unavailable:
                        why = getattr(exc, "db_code", None) or exc.code
                        click.echo(f"projection {which}: status unavailable ({why}); retrying", err=True)
                    unavailable = True
                    continue
                if unavailable:
                    click.echo(f"projection {which}: status available again", err=True)
                    unavailable = False
                now = time.monotonic()
                for name, status in (found.items() if isinstance(found, dict) else [(None, found)]):
                    before = last.get(name or "")
                    rate = 0.0 if before is None else (status.applied - before[1]) / max(now - before[0], 1e-9)
                    last[name or ""] = (now, status.applied)
                    if out.is_table:
                        emit_line(status, rate, name)
                    else:
                        emit({**({"store": name} if name is not None else {}), **to_data(status),
                              "applied_per_s": round(rate, 1)})
        finally:
            stop.set()
            thread.join()
            watcher.target.dispose()
    if failure:
        raise failure[0]


def emit_line(status: Any, rate: float, store: str | None = None) -> None:
    """One status line: position (source:revision), lag and applied updates per second."""
    source = status.source[:8] if status.source else "-"
    label = f"{store}  " if store is not None else ""
    click.echo(f"{label}{status.name}  position {source}:{status.applied_revision}  lag {status.lag}  "
               f"applied/s {rate:.1f}" + (f"  rebuilding ({status.pending_rebuild})" if status.pending_rebuild else ""))


@projection.command("status")
@_options(status=True)
@click.option("--all", "every", is_flag=True,
              help="List every projection with a checkpoint on the target, one row each (one store only).")
@output_options
@click.pass_obj
def projection_status(obj: CliContext, which: str, target: str | None, every: bool, out: Output) -> None:
    """Show where a projection stands against its source (applied revision, lag, rejections).

    --name takes a built-in projection, or any other projection checkpointed on the target (one
    you built with the library's ProjectionBuilder, say --name run_catalog), shown as its
    builder's status() reports it (for one fed by several stores, give each as --db NAME=URL with
    --target: one row per store). --all lists every projection of one store checkpointed on the
    target, and names below the table those fed by several stores.

    Example: fencepost projection status --format json
    """
    ctx = click.get_current_context()
    if every and ctx.get_parameter_source("which") is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--all and --name are exclusive (--all shows every projection on the target)")
    if every and obj.labelled:
        raise click.UsageError("--all works with one store, given as --db URL without a name: with several "
                               "stores (or a named one), show a projection with --name NAME")
    if every or which not in PROJECTIONS:
        _checkpointed_status(obj, None if every else which, target, out)
        return
    # Read-only on both sides: a target never built reports the whole source as lag, creating nothing.
    with _builder(obj, which, target, readonly_target=True) as builder:
        try:
            status = builder.status()
        finally:
            builder.target.dispose()
    if isinstance(status, dict):
        out.rows(_per_store(status), _STATUS_COLUMNS, title=f"projection {which}")
    else:
        out.record(to_data(status), title=f"projection {status.name}")


_LIST_COLUMNS = [Column("name", "name", wrap=False), Column("feed", "feed", wrap=False),
                 *_STATUS_COLUMNS[1:]]


def _checkpointed_status(obj: CliContext, which: str | None, target: str | None, out: Output) -> None:
    """The status of projection ``which`` (every one fed by one store when None) among those
    checkpointed on the target, each as a builder of it reports it: with one store, a projection
    fed by one store; with several named stores, one fed by several (each store's status). A
    projection known to the target only by its records (not a built-in one) is read through the
    stand-in the console uses; both sides are opened read-only, so nothing is created."""
    from fencepost.projections import ProjectionBuilder
    from fencepost.projections._recorded import checkpointed, fed_by_several
    from fencepost.projections.builder import ProjectionStatus

    if obj.labelled and target is None:
        raise click.UsageError("with several stores, name the database that holds the read model: --target URL")
    source: Any = obj.stores(readonly=True) if obj.labelled else read_store()
    target_db = _readonly_target(target or obj.resolved_url)
    try:
        single, several = checkpointed(target_db), fed_by_several(target_db)
        recorded = several if obj.labelled else single
        if which is not None:
            recorded = [r for r in recorded if r.name == which]
            if not recorded:
                raise fail(_not_checkpointed(which, obj.labelled, single, several, target_db.where))
        statuses = []
        for found in recorded:
            builtin = make_projection(found.name) if found.name in PROJECTIONS and not obj.labelled else None
            # A built-in one with its own code, so a row of --all is what --name NAME shows.
            projection = builtin if builtin is not None and builtin.feed == found.feed else found
            with ProjectionBuilder(source, target_db, projection, lock_timeout=5.0) as builder:
                statuses.append(builder.status())
    finally:
        where = target_db.where
        target_db.dispose()
    if which is not None:
        if isinstance(statuses[0], dict):
            out.rows(_per_store(statuses[0]), _STATUS_COLUMNS, title=f"projection {which}")
        else:
            out.record(to_data(statuses[0]), title=f"projection {statuses[0].name}")
        return
    footer = [] if statuses or several else [f"no projection has a checkpoint on {where}"]
    footer += [f"{one_line(r.name)} is fed by several stores ({_stores(r)}): show it with "
               f"{_store_options(r)} projection status --name NAME --target URL" for r in several]
    out.rows([to_data(s) for s in statuses], _LIST_COLUMNS, title="projections",
             fields=list(ProjectionStatus.__struct_fields__), footer=footer)


def _stores(recorded: Any) -> str:
    return ", ".join(one_line(s) for s in recorded.sources)


def _store_options(recorded: Any) -> str:
    return " ".join(f"--db {one_line(s)}=URL" for s in recorded.sources)


def _not_checkpointed(which: str, labelled: bool, single: list[Any], several: list[Any], where: str) -> str:
    """Why ``projection status --name which`` finds no projection of the kind the stores given can
    show: the other kind holds the name (fed by several stores, or by one), or nothing does."""
    name = one_line(which)
    for found in several if not labelled else ():
        if found.name == which:
            return (f"projection {name} on {where} is fed by several stores ({_stores(found)}): name each of "
                    f"them to show it ({_store_options(found)} --target URL)")
    for found in single if labelled else ():
        if found.name == which:
            return (f"projection {name} on {where} is fed by one store: give that store alone, as --db URL "
                    f"without a name, to show it")
    names = sorted(one_line(r.name) for r in (*single, *several))
    has = f"it has {', '.join(names)}" if names else "it has none"
    return (f"no projection {name} has a checkpoint on {where}: {has} "
            f"(--name also takes the built-in {' and '.join(PROJECTIONS)}, built there or not)")


@projection.command("rebuild")
@_options
@click.option("--source", "source_name", metavar="NAME", default=None,
              help="With several stores: rebuild only this store's rows (default: every store's).")
@progress_option
@output_options
@click.pass_obj
def projection_rebuild(obj: CliContext, which: str, target: str | None, source_name: str | None,
                       out: Output, progress: bool) -> None:
    """Rebuild the projection from revision 0 of the current source.

    A progress bar on stderr (when it is a terminal) shows the revision reached of the source's
    head (with several stores, each store's in turn).

    Example: fencepost projection rebuild --name ownership_history
    """
    if source_name is not None and not obj.labelled:
        raise click.UsageError("--source names one of several stores (--db NAME=URL ...); one store was given")
    if source_name is not None and source_name not in obj.stores(readonly=True):
        raise click.UsageError("--source names none of the given stores")
    with _busy_explained(which), _builder(obj, which, target) as builder:
        with progress_bar(f"rebuilding {which}", enabled=progress) as on_progress:
            result = builder.rebuild(source_name, on_progress=on_progress)
    if isinstance(result, dict):
        records = _per_store(result)
        if out.is_table:
            for r in records:
                out.message(f"{r['store']}: rebuilt: applied {r['applied']} at revision {r['revision']}")
        else:
            out.rows(records, [])
    elif out.is_table:
        out.message(f"rebuilt: applied {result.applied} at revision {result.revision}")
    else:
        out.record(to_data(result))
