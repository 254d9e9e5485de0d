"""``ProjectionBuilder``: consume a feed exactly once into a target, rebuild on source rotation.

Each page (REFERENCE 4 "Projection contract") is applied in ONE target transaction together with
its checkpoint ``(source, revision)``: a crash at any point leaves either the whole page and its
checkpoint or neither, so restarting re-reads exactly what was not applied. Inside that
transaction an update is applied only when it ``is_newer`` than what the projection holds for its
run id (same source, higher revision); anything else is rejected and counted.

A checkpoint whose source differs from the feed's, or whose revision is ahead of the source's (an
older copy restored with its source id), is never compared: the builder fills a shadow copy of the
projection's tables from revision 0 of the current source, page by page with its own checkpoint,
then swaps it in with one transaction (REFERENCE 4 "Rebuild protocol"). Readers of the target keep
seeing the old projection until that commit.

Fed by several named stores, the builder runs all of the above once per source, each source with
its own checkpoint row (its "share", ``_sources``): a page of one source is applied with that
source's checkpoint only, revisions of two sources are never compared, and a rotation of one source
rebuilds that source's rows alone (its shadow rows are swapped in by one transaction that replaces
exactly the rows keyed by its name) while the other sources keep being applied.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, get_args, overload

import msgspec
from sqlalchemy import Table, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from fencepost import _gauges
from fencepost._dialects import FILE_REPLACED, MISSING_OBJECT, replacement_check
from fencepost._durable import Database, DbFailure, carry_failure, map_failure, store_closed
from fencepost._migrations import PROJECTIONS, migrate, pending, permission_note
from fencepost._values import (
    identifier_problem,
    is_safe_int,
    seconds_problem,
    stop_problem,
    text_problem,
    value_problem,
)
from fencepost.changefeed.snapshot import SOURCE_SHAPE
from fencepost.changefeed.types import (
    Acknowledgement,
    Batch,
    Cancellation,
    Missing,
    Observed,
    StopSignal,
    Waiting,
    WaitingKind,
)
from fencepost.errors import FencepostError, OpenError, ProjectionError, SourceChanged
from fencepost.journal.owner import owner_problem
from fencepost.journal.replay import owner_of
from fencepost.projections import _sources, _sql, checkpoints
from fencepost.projections._feeds import Page
from fencepost.projections._lock import BuilderLock
from fencepost.projections._shadow import ShadowTables
from fencepost.projections._sources import SOURCE_COLUMN, Share
from fencepost.projections.checkpoints import Checkpoint, CheckpointMoved, RebuildRecord
from fencepost.projections.protocol import ConsensusFact, Projection, Target
from fencepost.runstore.rows import STATUSES

if TYPE_CHECKING:
    from fencepost._store import Store
    from fencepost.shards import ShardSet

T = TypeVar("T")


class OneSource:
    """Type marker: a ``ProjectionBuilder`` fed by one ``Store`` (``ProjectionBuilder[OneSource]``).

    Its ``catch_up``, ``rebuild``, ``status`` and ``rebuilds`` return one value (a ``CatchUp`` ...).
    Only type checkers see it; ``ProjectionBuilder(store, ...)`` is typed so without being told.
    """


class NamedSources:
    """Type marker: a ``ProjectionBuilder`` fed by named stores, a mapping or a ``ShardSet``
    (``ProjectionBuilder[NamedSources]``): its results are dicts by source name."""


Shape = TypeVar("Shape", OneSource, NamedSources)


log = logging.getLogger("fencepost.projections")

MAX_PAGE = 1000  # changes_since refuses larger pages (REFERENCE 4)
_RETRIES = 50  # consecutive source races tolerated before giving up
_MOVED = {  # what ``offer`` says when the source is no longer the one the projection reflects
    "source_changed": "the source was rotated or replaced since the projection was built: catch_up rebuilds it",
    "source_rewound": "the source was restored from an older copy since the projection was built (its revision "
                      "is behind the checkpoint): catch_up rebuilds it",
    "journal_diverged": "the journal differs from the one the projection was built from (restored or replaced): "
                        "catch_up rebuilds it",
}


class CatchUp(msgspec.Struct, frozen=True):
    """What one ``catch_up`` did: updates applied and rejected, whether it rebuilt, where it ended."""

    applied: int
    rejected: int
    rebuilt: bool
    revision: int


class ProjectionStatus(msgspec.Struct, frozen=True):
    """Where a projection stands against its source.

    ``source``/``applied_revision`` is what the projection reflects (``source`` is None until a
    page consumed a revision: never built, or caught up with an empty feed);
    ``current_source``/``source_revision`` is the feed now. ``lag`` is the number of
    revisions (journal positions for a consensus projection) still to consume; while a rebuild is
    pending (``pending_rebuild`` names why: ``source_changed``, ``source_rewound``,
    ``journal_diverged``, ``requested``, or ``table_missing`` when a table of the projection was
    dropped on the target) it is the whole source revision. ``applied`` (every
    committed application, shadow fills included), ``rejected`` and ``rebuilds`` are totals since the
    checkpoint was created.
    """

    name: str
    feed: str
    source: str | None
    applied_revision: int
    current_source: str
    source_revision: int
    lag: int
    applied: int
    rejected: int
    rebuilds: int
    pending_rebuild: str | None
    last_rebuild: RebuildRecord | None


def worth_waiting(exc: BaseException) -> bool:
    """Whether a builder (or a reader of its status) waits ``exc`` out and tries again: only an
    unavailable database is; every other error is a defect, and a closed store does not come back."""
    if isinstance(exc, FencepostError) and exc.code != "persistence_failed":
        return False
    return isinstance(exc, (DbFailure, FencepostError)) and not store_closed(exc)


def _target_database(url: str) -> Database:
    """The target ``Database`` of a URL, or the ``ProjectionError`` saying why not, raised outside the
    ``except`` so the refusal keeps no context: a URL's rule is named, never its values; a SQLite
    path that cannot be a file (a directory ...) gets the code and text every later failure of the
    target has."""
    error: ProjectionError
    try:
        return Database(url, make_dirs=False)  # made by the first write (``_reach_target``), never by a read
    except ValueError as exc:
        error = ProjectionError("invalid_projection", "ProjectionBuilder",
                                f"target is not a usable database URL: {exc}")
    except OpenError as exc:
        error = ProjectionError(exc.code, "ProjectionBuilder", f"projection target: {exc.detail}")
    raise error


def _target_error(problem: str, method: str, detail: str, db_code: str | None, transient: bool) -> ProjectionError:
    """A target failure named like an open failure (``detail`` as ``fencepost.open`` words it),
    with ``db_code`` and ``transient`` as every error from the database carries them."""
    err = ProjectionError(problem, method, "projection target: " + detail)
    err.db_code = db_code  # type: ignore[attr-defined]
    err.transient = transient  # type: ignore[attr-defined]
    return err


class ProjectionBuilder(Generic[Shape]):
    """Keep ``projection`` on the database at ``target`` from the store ``source`` (or several stores).

    Parameters
    ----------
    source:
        The ``Store`` whose change feed (or journal, for a consensus projection) is consumed; or
        several named stores, a mapping ``{"edge-1": store_a, "central": store_b}`` (any mix of
        backends) or a ``ShardSet``. Names are 1..64 characters of ``A-Z a-z 0-9 . _ -``. With
        named sources, ``catch_up``, ``rebuild``, ``status`` and ``rebuilds`` return one entry per
        source name, and the projection keys its rows by ``source_name`` (built-in projections are
        switched to that shape with their ``keyed_by_source()``). Type checkers see the shape:
        ``ProjectionBuilder(store, ...)`` is a ``ProjectionBuilder[OneSource]`` whose ``catch_up()``
        is a ``CatchUp``, named sources give a ``ProjectionBuilder[NamedSources]`` whose results are
        ``dict[str, ...]``.
    target:
        A database URL (or an open ``Database``): the source's own database or another one, on
        either backend. The builder's tables (migration block ``projections``) and the projection's
        tables are created there if absent. An empty URL is refused (it never means the default).
        A URL is parsed and its file or server checked here, as ``fencepost.open`` does: a URL that
        is not one (a bad scheme, option or schema name) raises ``ValueError``, a SQLite path that
        cannot be a file (its parent is a file) ``OpenError``; failures met on first contact with
        the database (no server, no such database, not a database) are ``ProjectionError``.
    projection:
        The read model (``RunsByStatus``, ``OwnershipHistory`` or your own ``Projection``).
    batch_size:
        Changes per page and per target transaction (1..1000).
    lock_timeout:
        Seconds to wait when another builder holds this projection name on this target: ``0``
        refuses at once with ``ProjectionError`` (code ``builder_busy``), ``None`` waits forever.
        Otherwise a finite number ``>= 0``.
    poll_interval:
        Seconds between safety-net polls in ``run`` (and the back-off after a failed catch-up): a
        finite number ``> 0``.

    A bad argument (here, or ``run``'s ``stop`` and ``offer``'s updates at the call) raises
    ``ProjectionError`` with code ``invalid_projection`` naming it, before anything is written.
    """

    @overload
    def __init__(
        self: ProjectionBuilder[OneSource],
        source: Store,
        target: str | Database,
        projection: Projection,
        *,
        batch_size: int = ...,
        lock_timeout: float | None = ...,
        poll_interval: float = ...,
    ) -> None: ...

    @overload
    def __init__(
        self: ProjectionBuilder[NamedSources],
        source: Mapping[str, Store] | ShardSet,
        target: str | Database,
        projection: Projection,
        *,
        batch_size: int = ...,
        lock_timeout: float | None = ...,
        poll_interval: float = ...,
    ) -> None: ...

    def __init__(
        self,
        source: Store | Mapping[str, Store] | ShardSet,
        target: str | Database,
        projection: Projection,
        *,
        batch_size: int = 500,
        lock_timeout: float | None = 0.0,
        poll_interval: float = 1.0,
    ) -> None:
        named = _sources.resolve(source)
        problem = identifier_problem(getattr(projection, "name", None))
        if problem:
            raise ProjectionError("invalid_projection", "ProjectionBuilder", f"projection name {problem}")
        feed = getattr(projection, "feed", "runs")
        if feed not in ("runs", "consensus"):
            raise ProjectionError("invalid_projection", "ProjectionBuilder", "feed must be 'runs' or 'consensus'")
        tables = list(getattr(projection, "tables", ()))
        if not tables or not all(isinstance(t, Table) for t in tables):
            raise ProjectionError("invalid_projection", "ProjectionBuilder", "tables must be SQLAlchemy Tables")
        if not all(t.name for t in tables):
            raise ProjectionError("invalid_projection", "ProjectionBuilder", "table names must not be empty")
        problem = _sql.nul_name(tables)
        if problem:
            raise ProjectionError("invalid_projection", "ProjectionBuilder", problem)
        placed = next((t.name for t in tables if t.schema is not None), None)
        if placed is not None:
            raise ProjectionError("invalid_projection", "ProjectionBuilder",
                                  f"table {placed!r} is declared with schema=: a projection's tables live where the "
                                  "builder's checkpoints do, in the target's own schema (the schema= of a "
                                  "PostgreSQL target's URL); declare it without one")
        if named is None and "@" in projection.name:
            # ``<projection>@<source name>`` names the checkpoint of each source of a projection fed
            # by several: a name with ``@`` would read (and write) another projection's position.
            raise ProjectionError("invalid_projection", "ProjectionBuilder",
                                  "projection name must not contain '@' when it is fed by one source ('@' "
                                  "separates a projection's name from a source name in the checkpoints of "
                                  "projections fed by several sources)")
        if named is not None and not _sources.keyed_by_source(tables):
            keyed = getattr(projection, "keyed_by_source", None)
            if callable(keyed):
                projection = keyed()
                tables = list(getattr(projection, "tables", ()))
            if not all(isinstance(t, Table) for t in tables) or not _sources.keyed_by_source(tables):
                raise ProjectionError("invalid_projection", "ProjectionBuilder",
                                      f"fed by several sources, every table needs a {SOURCE_COLUMN} column "
                                      "in its primary key")
        reserved = next((t.name for t in ShadowTables(projection, tables).all() if _sql.reserved_table(t.name)), None)
        if reserved is not None:
            raise ProjectionError("invalid_projection", "ProjectionBuilder",
                                  f"table {reserved!r} is named like one of fencepost's own tables "
                                  f"(names starting with {_sql.RESERVED_PREFIX!r} and the builder's tables are taken)")
        if named is None and getattr(projection, "by_source", False) is True:
            raise ProjectionError("invalid_projection", "ProjectionBuilder",
                                  f"a projection keyed by {SOURCE_COLUMN} needs named sources")
        if type(batch_size) is not int or not 1 <= batch_size <= MAX_PAGE:
            raise ProjectionError("invalid_projection", "ProjectionBuilder", f"batch_size must be 1..{MAX_PAGE}")
        if not (isinstance(target, Database) or (type(target) is str and target)):
            raise ProjectionError("invalid_projection", "ProjectionBuilder",
                                  "target must be a non-empty database URL or an open Database")
        if isinstance(target, Database) and target.closed:
            raise ProjectionError("invalid_projection", "ProjectionBuilder",
                                  "target is a closed Database: give an open one, or the database URL")
        problem = None if lock_timeout is None else seconds_problem(lock_timeout, allow_zero=True)
        if problem:
            raise ProjectionError("invalid_projection", "ProjectionBuilder", f"lock_timeout {problem} (or None)")
        problem = seconds_problem(poll_interval, allow_zero=False)
        if problem:
            raise ProjectionError("invalid_projection", "ProjectionBuilder", f"poll_interval {problem}")
        self.source = source
        self.sources: dict[str, Store] | None = named
        self.projection = projection
        self.name: str = projection.name
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self._lock_timeout = lock_timeout
        if isinstance(target, str):
            target = _target_database(target)
            self._owns_target = True
        else:
            self._owns_target = False
        self.target = target
        problem = _sql.truncated_name(ShadowTables(projection, tables), target.backend.name)
        if problem:
            if self._owns_target:
                target.close()
            raise ProjectionError("invalid_projection", "ProjectionBuilder", problem)
        self._feed_kind: str = feed
        if named is None:
            self._shares = [Share(self.name, None, source, feed)]  # type: ignore[arg-type]
        else:
            self._shares = [Share(self.name, label, store, feed) for label, store in named.items()]
        self._tables = ShadowTables(projection, tables, guard=lambda what: self._projection_code(what))
        # ``what`` of the projection's own code (apply, reset) whose statement the target refused in
        # this thread's current write, else None (see ``_projection_code``).
        self._refused = threading.local()
        self._lock = BuilderLock(self.target, self.name)
        self._prepared = False
        self._recheck_tables = False  # set by a failed target write: the next call checks the tables
        self._reached = False
        self._shares_migrated = False  # the target's checkpoints record source shares (3002), as last read
        self._closed = threading.Event()
        self._running = threading.Lock()
        # Test hook: called after each committed page with (shadow, page).
        self._after_page: Callable[[bool, Page], None] | None = None
        # Called with (source label or None, reason) once a rebuild has begun (committed): a shadow
        # fill from revision 0, or a dropped live table built again (``table_missing``). The CLI's
        # ``projection run --follow`` says so with it.
        self._on_rebuild: Callable[[str | None, str], None] | None = None

    # ------------------------------------------------------------------ public surface
    @overload
    def catch_up(self: ProjectionBuilder[OneSource], *,
                 on_progress: Callable[[int, int], None] | None = ...) -> CatchUp: ...

    @overload
    def catch_up(self: ProjectionBuilder[NamedSources], *,
                 on_progress: Callable[[int, int], None] | None = ...) -> dict[str, CatchUp]: ...

    def catch_up(self, *, on_progress: Callable[[int, int], None] | None = None) -> CatchUp | dict[str, CatchUp]:
        """Apply everything up to the source's current revision, rebuilding first if it rotated.

        Returns the updates applied and rejected by this call, whether a rebuild was swapped in,
        and the revision the projection now reflects. With named sources: one ``CatchUp`` per
        source name; every source is caught up even when one fails, then the first failure is raised.

        ``on_progress(revision, head)``, when given, is called before the first page and after every
        page (``batch_size`` changes) with the revision the projection (or the shadow copy a rebuild
        fills) has reached and the source's head revision, read at every page (at least
        ``revision``); the last call has ``revision == head``. With named sources, each source is
        reported in turn, from its own revision to its own head. An exception it raises
        (``KeyboardInterrupt`` ...) stops the catch-up after the last committed page, which the
        next call resumes from.
        """
        self._check_progress(on_progress, "catchUp")
        self._acquire()

        def one(share: Share) -> CatchUp:
            self._take_turn(share, "catchUp")
            try:
                return self._catch_up(share, on_progress)
            finally:
                share.turn.release()

        if self.sources is None:
            return one(self._shares[0])
        return self._each(self._shares, one)

    @overload
    def rebuild(self: ProjectionBuilder[OneSource], source_name: None = ..., *,
                on_progress: Callable[[int, int], None] | None = ...) -> CatchUp: ...

    @overload
    def rebuild(self: ProjectionBuilder[NamedSources], source_name: str | None = ..., *,
                on_progress: Callable[[int, int], None] | None = ...) -> dict[str, CatchUp]: ...

    def rebuild(self, source_name: str | None = None, *,
                on_progress: Callable[[int, int], None] | None = None) -> CatchUp | dict[str, CatchUp]:
        """Rebuild from revision 0 of the current source into a shadow copy, then swap it in.

        With named sources, every source's share is rebuilt, or only ``source_name``'s; the rows of
        the other sources are left as they are. ``on_progress`` is reported as by ``catch_up``,
        from revision 0.

        Called while ``run`` follows in another thread (or another call works on the same source),
        it first waits for that pass to end, then rebuilds alone: the result is always this call's
        rebuild (``rebuilt=True``), or an error (``projection_failed`` when the builder is closed
        meanwhile).
        """
        self._check_progress(on_progress, "rebuild")
        shares = self._select(source_name, "rebuild")
        self._acquire()

        def start(share: Share) -> None:
            source, _head = share.feed.head()

            def body(conn: Connection) -> None:
                cp = self._load_in(conn, share)
                self._tables.reset(conn, self.target.backend, share)
                checkpoints.start_shadow(conn, cp, source=source, reason="requested", now_ms=self._now(share))

            self._write(body, method="rebuild")

        def one(share: Share) -> CatchUp:
            # Alone on the share from the shadow's start to its swap: a pass of ``run`` in another
            # thread would otherwise fill and swap this rebuild itself, and this call, finding
            # nothing left to rebuild, would report ``rebuilt=False``.
            self._take_turn(share, "rebuild")
            try:
                start(share)
                return self._catch_up(share, on_progress)
            finally:
                share.turn.release()

        if self.sources is None:
            return one(shares[0])
        return self._each(shares, one)

    def run(self, stop: StopSignal | None = None) -> None:
        """Catch up, then follow the source until ``stop`` is set (or the builder is closed).

        Wake-ups come from the change feed's ``follow`` (watchfiles or LISTEN/NOTIFY); a poll every
        ``poll_interval`` seconds is the safety net. A database that is briefly unavailable is
        retried after ``poll_interval``; ``builder_busy`` and invalid projections propagate, and a
        SQLite source file replaced or removed at its path ends the run (``projection_failed``:
        reopen the store, the builder then rebuilds), as does a SQLite target file deleted or replaced
        under the builder (``projection_failed``, ``db_code`` ``file_replaced``: a new builder on the
        target URL builds the projection onto the file now at its path). With
        named sources each source is followed by its own thread, so a source that is down or being
        rebuilt holds none of the others back; an error that propagates stops them all.

        One ``run()`` at a time per builder: a second call while one follows (from another thread)
        raises ``ProjectionError`` (``builder_busy``) at once; once the first has returned, ``run()``
        may be called again. ``catch_up()`` and ``rebuild()`` from other threads take turns with it.
        """
        problem = stop_problem(stop)
        if problem:
            raise ProjectionError("invalid_projection", "run", f"stop {problem}")
        stop = stop if stop is not None else threading.Event()
        self._refuse_closed("run")
        if not self._running.acquire(blocking=False):
            self._refuse_closed("run")  # ``close()`` holds it a moment: say closed, not busy
            # Waiting would last until the other call's ``stop`` is set: refuse as a second builder
            # of the name is refused, at once (``lock_timeout`` is for another builder, not this one).
            raise ProjectionError("builder_busy", "run", "run() is already following on this builder (in "
                                  "another thread): set that call's stop and let it return before calling "
                                  "run() again; one run() follows every source")
        try:
            self._acquire()
            if self.sources is None:
                self._follow(self._shares[0], stop)
            else:
                self._follow_all(stop)
        finally:
            self._running.release()

    def _follow_all(self, stop: StopSignal) -> None:
        halt = threading.Event()  # set by the first share that fails, or once ``stop`` is set
        failures: list[BaseException] = []

        def work(share: Share) -> None:
            try:
                self._follow(share, halt)
            except BaseException as exc:  # raised in the calling thread below
                failures.append(exc)
                halt.set()

        threads = [threading.Thread(target=work, args=(share,), daemon=True,
                                    name=f"projection-{self.name}-{share.label}") for share in self._shares]
        for thread in threads:
            thread.start()
        try:
            while not halt.is_set() and not self._stopping(stop):
                halt.wait(0.05)  # ``stop`` need only answer is_set()
        finally:
            halt.set()
            for thread in threads:
                thread.join()
        if failures:
            raise failures[0]

    def _follow(self, share: Share, stop: StopSignal) -> None:
        wake = threading.Event()
        quit_watch = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(share, wake, quit_watch), daemon=True,
                                   name=f"projection-{share.checkpoint}-watch")
        watcher.start()
        replaced = replacement_check(share.store.db.backend, share.store.db.path)
        try:
            while not self._stopping(stop):
                wake.clear()
                if replaced():
                    # The store's connections keep the old SQLite file open: following on would
                    # project a database that no longer exists at its path, as if caught up.
                    gone = ProjectionError(
                        "projection_failed", "run", "the source database file was replaced or removed under "
                        "the builder: reopen the store at its path (the builder then rebuilds onto it)")
                    gone.source_replaced = True
                    gone.store = share.label
                    raise gone
                if not self._take_turn(share, "run", stop):
                    break
                try:
                    # A PostgreSQL restart ends the lock's session: each pass takes it again if so.
                    self._lock.acquire(self._lock_timeout)
                    self._prepare()
                    self._catch_up(share)
                except (DbFailure, FencepostError) as exc:
                    if not worth_waiting(exc):
                        raise
                    log.warning("projection %s: catch-up failed (%s); retrying", share.checkpoint,
                                getattr(exc, "db_code", None) or exc.code or "persistence_failed")
                finally:
                    share.turn.release()
                self._wait(wake, stop, self.poll_interval)
        finally:
            quit_watch.set()
            watcher.join(timeout=5)

    @overload
    def status(self: ProjectionBuilder[OneSource]) -> ProjectionStatus: ...

    @overload
    def status(self: ProjectionBuilder[NamedSources]) -> dict[str, ProjectionStatus]: ...

    def status(self) -> ProjectionStatus | dict[str, ProjectionStatus]:
        """Read the checkpoint and the source head: lag, rejected, rebuilds, last rebuild.

        Read-only on both sides: a target where this projection was never built (no tables, no
        checkpoint) reports ``source=None``, ``applied_revision=0`` and the whole source as lag.
        With named sources: one ``ProjectionStatus`` per source name, each against its own source.
        """

        def body(conn: Connection) -> tuple[list[tuple[Checkpoint | None, RebuildRecord | None]], bool]:
            # A stand-in for a projection known only by its records on a target that predates the
            # record of its tables (``_recorded``) cannot say whether one was dropped.
            known = getattr(self.projection, "tables_recorded", True)
            names = [t.name for t in self._tables.live.values()] if known else []
            missing = not self.target.backend.existing_tables(conn, names).issuperset(names)
            self._refuse_other_kind(conn, "status")
            return [(checkpoints.load(conn, share.checkpoint), checkpoints.last_rebuild(conn, share.checkpoint))
                    for share in self._shares], missing

        self._refuse_closed("status")
        found, missing = self._read(body) if self._target_ready() else ([(None, None)] * len(self._shares), False)
        statuses = [self._status(share, cp, last, table_missing=missing)
                    for share, (cp, last) in zip(self._shares, found, strict=True)]
        if self.sources is None:
            return statuses[0]
        return {share.label: st for share, st in zip(self._shares, statuses, strict=True)}  # type: ignore[misc]

    def _status(self, share: Share, cp: Checkpoint | None, last: RebuildRecord | None, *,
                table_missing: bool = False) -> ProjectionStatus:
        if cp is None:
            cp = Checkpoint(share.checkpoint, self._feed_kind, None, 0, None, 0, 0, 0, None, None, None, None, None,
                            None, 0)
        source, head = share.feed.head()
        pending = self._pending_reason(share, cp, source, head)
        if pending is None and table_missing and cp.source is not None:
            pending = "table_missing"  # dropped on the target: the next catch-up builds it again
        if pending is None and cp.source == source:
            lag = head - cp.revision
        else:
            lag = head
        return ProjectionStatus(
            name=self.name, feed=self._feed_kind, source=cp.source, applied_revision=cp.revision,
            current_source=source, source_revision=head, lag=lag, applied=cp.applied, rejected=cp.rejected,
            rebuilds=cp.rebuilds, pending_rebuild=pending, last_rebuild=last,
        )

    @overload
    def rebuilds(self: ProjectionBuilder[OneSource]) -> list[RebuildRecord]: ...

    @overload
    def rebuilds(self: ProjectionBuilder[NamedSources]) -> dict[str, list[RebuildRecord]]: ...

    def rebuilds(self) -> list[RebuildRecord] | dict[str, list[RebuildRecord]]:
        """Every completed rebuild of this projection on this target, oldest first (read-only).

        With named sources: the list of each source's share, by source name.
        """
        self._refuse_closed("rebuilds")
        if not self._target_ready():
            found: list[list[RebuildRecord]] = [[] for _ in self._shares]
        else:
            def body(conn: Connection) -> list[list[RebuildRecord]]:
                self._refuse_other_kind(conn, "rebuilds")
                return [checkpoints.rebuild_log(conn, s.checkpoint) for s in self._shares]

            found = self._read(body)
        if self.sources is None:
            return found[0]
        return {share.label: records for share, records in zip(self._shares, found, strict=True)}  # type: ignore[misc]

    def offer(self, updates: Iterable[Any], source_name: str | None = None) -> CatchUp:
        """Apply snapshots obtained elsewhere (``store.feed.read``), each only if it ``is_newer``.

        The checkpoint does not move; stale or foreign-source updates are rejected and counted
        (in ``status().rejected`` too), as is everything offered before the projection's first page.
        With named sources, ``source_name`` says whose store the snapshots were read from.
        ``updates`` must be an iterable of ``Observed``/``Missing`` snapshots, or the ``Batch``
        ``store.feed.read`` returns (``ConsensusFact``s for a consensus projection), none of them ahead
        of its source's head and every field as the feed delivers it; anything else is refused
        (``invalid_projection`` naming the item's index and field) before the target is touched.

        When the source is no longer the one the projection reflects (rotated, or an older copy
        restored with its source id: the checkpoint is ahead of its head), raises ``SourceChanged``
        (``rotated`` says which) and writes nothing: ``catch_up`` rebuilds the projection, then
        offers are compared again.
        """
        items = self._offered(updates)
        share = self._select(source_name, "offer", one=True)[0]
        _sources.refuse_closed(self._shares, "offer", share)
        # A snapshot of this source past its head cannot have come from its feed; applied, it would
        # hold that revision for the run and shadow every real change of it until a rebuild.
        # The head only grows (unless an older copy is restored), so one read before the write is enough.
        source, head = share.feed.head()
        for index, item in enumerate(items):
            if item.source == source and item.revision > head:
                # Unless the source was restored under the projection (its checkpoint is ahead of
                # the head too): then the snapshot may well be real, and the answer is a rebuild.
                if self._target_ready():
                    self._refuse_if_moved(share, self._read(lambda conn: checkpoints.load(conn, share.checkpoint)),
                                          source, head)
                raise ProjectionError("invalid_projection", "offer",
                                      f"updates #{index} is ahead of its source (revision {item.revision} "
                                      f"> the source's {head}): not a snapshot the feed gave")
        self._acquire()

        def body(conn: Connection) -> tuple[int, int]:
            cp = self._load_in(conn, share)
            # A projection of a restored or rotated source compares nothing until it is rebuilt: its
            # held revisions belong to a history the source no longer has (raised here, the write
            # rolls back with nothing in it).
            self._refuse_if_moved(share, cp, source, head)
            if cp.source is None:  # before the first page nothing can be compared: counted as rejected
                accepted, rejected = 0, len(items)
            else:
                accepted, rejected = self._apply_in(conn, share, cp.source, items, shadow=False)
            conn.execute(
                _sql.checkpoints.update().where(_sql.checkpoints.c.name == share.checkpoint).values(
                    applied=_sql.checkpoints.c.applied + accepted,
                    rejected=_sql.checkpoints.c.rejected + rejected,
                )
            )
            return accepted, rejected

        applied, rejected = self._write(body)
        return CatchUp(applied, rejected, False, self._read(lambda conn: self._load_in(conn, share)).revision)

    def _offered(self, updates: object) -> list[Any]:
        """``updates`` as a list, each one checked: the type the projection's feed delivers, every
        field as that feed could have delivered it (``_offered_problem``)."""
        def refuse(detail: str) -> ProjectionError:
            return ProjectionError("invalid_projection", "offer", f"updates {detail}")

        if isinstance(updates, Batch):  # what ``store.feed.read`` returns
            updates = updates.snapshots

        if isinstance(updates, (str, bytes, Mapping)):
            raise refuse("must be an iterable of snapshots")
        try:
            items = list(updates)  # type: ignore[call-overload]
        except TypeError:
            raise refuse("must be an iterable of snapshots") from None
        kinds: tuple[type, ...] = (ConsensusFact,) if self._feed_kind == "consensus" else (Observed, Missing)
        wanted = "a ConsensusFact" if self._feed_kind == "consensus" else "an Observed or Missing snapshot"
        for index, item in enumerate(items):
            if type(item) not in kinds:
                raise refuse(f"#{index} must be {wanted} (as this projection's feed delivers)")
            problem = _offered_problem(item)
            if problem is not None:
                raise refuse(f"#{index}.{problem}")
        return items

    def close(self) -> None:
        """Stop ``run``, release the builder lock and the target's connections."""
        self._closed.set()
        # Let a ``run`` in another thread finish its page before the lock and engine go away.
        if self._running.acquire(timeout=60):
            self._running.release()
        for share in self._shares:
            _gauges.projection_lag.discard(**self._gauge_labels(share))
        self._lock.close()
        if self._owns_target:
            self.target.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ several sources
    def _select(self, source_name: str | None, method: str, *, one: bool = False) -> list[Share]:
        """The shares a call addresses: all (or the one) without ``source_name``, else that one."""
        if self.sources is None:
            if source_name is not None:
                raise ProjectionError("invalid_sources", method, "source_name: this builder has one unnamed source")
            return self._shares
        if source_name is None:
            if one:
                raise ProjectionError("invalid_sources", method, "source_name is required with several sources")
            return self._shares
        for share in self._shares:
            if share.label == source_name:
                return [share]
        raise ProjectionError("invalid_sources", method, "source_name names no source of this builder")

    def _each(self, shares: list[Share], fn: Callable[[Share], CatchUp]) -> dict[str, CatchUp]:
        """Run ``fn`` for every share; one source's failure never stops the others, then it is raised."""
        results: dict[str, CatchUp] = {}
        failure: BaseException | None = None
        for share in shares:
            try:
                results[share.label] = fn(share)  # type: ignore[index]
            except (DbFailure, FencepostError) as exc:
                if isinstance(exc, ProjectionError) and exc.code == "builder_busy":
                    raise
                failure = failure or exc
        if failure is not None:
            raise failure
        return results

    def _gauge_labels(self, share: Share) -> dict[str, str]:
        if share.label is None:
            return {"projection": self.name}
        return {"projection": self.name, "source": share.label}

    # ------------------------------------------------------------------ catch-up and rebuild
    @staticmethod
    def _check_progress(on_progress: object, method: str) -> None:
        if on_progress is not None and not callable(on_progress):
            raise ProjectionError("invalid_projection", method, "on_progress must be callable (or None)")

    def _catch_up(self, share: Share, on_progress: Callable[[int, int], None] | None = None) -> CatchUp:
        applied = rejected = 0
        rebuilt = False
        races = 0
        feed = share.feed
        while True:
            try:
                cp = self._read(lambda conn: self._load_in(conn, share))
                source, head = feed.head()
                reason = self._pending_reason(share, cp, source, head)
                if reason is not None:
                    a, r = self._rebuild(share, cp, reason, source, head, on_progress)
                    applied, rejected, rebuilt, races = applied + a, rejected + r, True, 0
                    continue
                if on_progress is not None:
                    on_progress(cp.revision, max(head, cp.revision))
                page = feed.page(source, cp.revision, self.batch_size)
                a, r = self._commit(share, cp, page, shadow=False)
            except (SourceChanged, CheckpointMoved):
                # The source rotated or rewound between two reads, or the checkpoint moved under
                # us: re-read both and decide again; never compare across sources.
                races += 1
                if races > _RETRIES:
                    raise ProjectionError(
                        "projection_failed", "catchUp", "source kept changing under the builder"
                    ) from None
                # Jittered backoff: two writers of one checkpoint (a lost lock) must not retry in
                # lockstep, or each keeps moving the checkpoint under the other.
                time.sleep(random.random() * min(0.001 * 2 ** min(races, 8), 0.25))
                continue
            applied, rejected, races = applied + a, rejected + r, 0
            _gauges.projection_lag.set(max(0, head - page.next_revision), **self._gauge_labels(share))
            if not page.has_more:
                if on_progress is not None:
                    on_progress(page.next_revision, page.next_revision)
                return CatchUp(applied, rejected, rebuilt, page.next_revision)

    def _pending_reason(self, share: Share, cp: Checkpoint, source: str, head: int) -> str | None:
        return self._source_moved(share, cp, source, head) or cp.shadow_reason

    @staticmethod
    def _source_moved(share: Share, cp: Checkpoint, source: str, head: int) -> str | None:
        """Why the source (now ``source`` at ``head``) is no longer the one ``cp`` reflects:
        ``source_changed`` (rotated, or another database), ``source_rewound`` (an older copy restored
        with its source id), ``journal_diverged``; None when it still is (or nothing was applied)."""
        if cp.source is None:
            return None
        if cp.source != source:
            return "source_changed"
        if cp.revision > head:
            return "source_rewound"
        if cp.anchor is not None and share.feed.anchor_at(cp.revision) != cp.anchor:
            return "journal_diverged"
        return None

    def _refuse_if_moved(self, share: Share, cp: Checkpoint | None, source: str, head: int) -> None:
        """Raise ``SourceChanged`` (method ``offer``) when the source is no longer the one ``cp``
        reflects: as for a feed position of a restored or rotated source, the answer is a rebuild."""
        reason = None if cp is None else self._source_moved(share, cp, source, head)
        if reason is None:
            return
        err = SourceChanged("invalid_run", "offer", _MOVED[reason])
        err.rotated = reason == "source_changed"
        raise err

    def _rebuild(self, share: Share, cp: Checkpoint, reason: str, source: str, head: int,
                 on_progress: Callable[[int, int], None] | None = None) -> tuple[int, int]:
        feed = share.feed
        resumable = (
            cp.shadow_source == source
            and cp.shadow_revision is not None
            and cp.shadow_revision <= head
            and (cp.shadow_anchor is None or feed.anchor_at(cp.shadow_revision) == cp.shadow_anchor)
        )
        share.shadow_marker = None
        if not resumable:
            def start(conn: Connection) -> None:
                current = self._load_in(conn, share)
                if current != cp:
                    raise CheckpointMoved()
                self._tables.reset(conn, self.target.backend, share)
                checkpoints.start_shadow(conn, cp, source=source, reason=reason, now_ms=self._now(share))

            def start_and_say(conn: Connection) -> None:
                start(conn)
                self._rebuild_begun(share, reason)

            self._write(start_and_say, method="rebuild")
            cp = self._read(lambda conn: self._load_in(conn, share))
        applied = rejected = 0
        while True:
            assert cp.shadow_revision is not None
            if on_progress is not None:
                on_progress(cp.shadow_revision, max(head, cp.shadow_revision))
            page = feed.page(source, cp.shadow_revision, self.batch_size)
            a, r = self._commit(share, cp, page, shadow=True)
            applied, rejected = applied + a, rejected + r
            cp = self._read(lambda conn: self._load_in(conn, share))
            if not page.has_more:
                break

        def swap(conn: Connection) -> None:
            current = self._load_in(conn, share)
            if current != cp:
                raise CheckpointMoved()
            self._tables.swap(conn, self.target.backend, share)
            checkpoints.swap_shadow(conn, cp, now_ms=self._now(share))

        self._write(swap, method="rebuild")
        self._empty_shadow(share)
        return applied, rejected

    def _empty_shadow(self, share: Share) -> None:
        """After a swap: the shadow's rows (the old projection, when the swap renamed tables) are
        deleted in a write of their own, outside the swap's transaction, unless a rebuild has begun
        since (the shadow is then that rebuild's: another builder that took the name after this
        one's lock was lost, whose pages must stay). The rebuild is done whatever happens here: a
        failure (the projection's own ``reset`` included) is logged, and the next rebuild empties
        the shadow first."""
        def body(conn: Connection) -> None:
            if self._load_in(conn, share).shadow_source is None:
                self._tables.empty_shadow(conn, self.target.backend, share)

        try:
            self._write(body, durable=False, method="rebuild")
        except Exception as exc:
            log.warning("projection %s: the shadow tables could not be emptied after the swap (%s); "
                        "the next rebuild empties them", share.checkpoint,
                        getattr(exc, "code", None) or type(exc).__name__)

    def _rebuild_begun(self, share: Share, reason: str) -> None:
        """Inside the write that begins a rebuild: tell ``_on_rebuild`` once that write has committed."""
        hook = self._on_rebuild
        if hook is not None:
            self.target.after_commit(lambda: hook(share.label, reason))

    def _commit(self, share: Share, cp: Checkpoint, page: Page, *, shadow: bool) -> tuple[int, int]:
        expected_source = cp.shadow_source if shadow else (cp.source or page.source)
        if page.source != expected_source:
            raise CheckpointMoved()

        def body(conn: Connection) -> tuple[int, int]:
            accepted, rejected = self._apply_in(conn, share, page.source, page.updates, shadow=shadow)
            now = self._now(share)
            if shadow:
                share.shadow_marker = self.target.backend.write_marker(conn)
                checkpoints.advance_shadow(conn, cp, revision=page.next_revision, anchor=page.anchor,
                                           applied=accepted, rejected=rejected, now_ms=now)
            else:
                checkpoints.advance_live(conn, cp, source=page.source, revision=page.next_revision,
                                         anchor=page.anchor, applied=accepted, rejected=rejected, now_ms=now)
            return accepted, rejected

        # Only the last page of a pass waits for the disk: it makes the earlier ones durable too (one
        # log), and until then a power loss undoes pages whole, each with its checkpoint, so the
        # builder resumes after the last page that survived. A shadow page never waits: the swap does.
        # A shadow page is the rebuild's: its failure says so ("Projection.rebuild: ...").
        result = self._write(body, durable=not (shadow or page.has_more), method="rebuild" if shadow else "apply")
        if self._after_page is not None:
            self._after_page(shadow, page)
        return result

    def _apply_in(self, conn: Connection, share: Share, source: str, updates: Sequence[Any], *,
                  shadow: bool) -> tuple[int, int]:
        """Apply the updates that are newer than what is held, in order; return (applied, rejected)."""
        if not updates:
            return 0, 0
        name = share.checkpoint
        ids = msgspec.json.encode(list(dict.fromkeys(u.run_id for u in updates))).decode()
        held: dict[str, tuple[str, int]] = {
            run_id: (held_source, int(revision))
            for run_id, held_source, revision in _sql.held_rows(conn, shadow, name, ids)
        }
        newest: dict[str, tuple[str, int]] = {}
        accepted: list[Any] = []
        rejected = 0
        for update in updates:
            current = newest.get(update.run_id) or held.get(update.run_id)
            # is_newer (REFERENCE 4): same source and a strictly higher revision than held.
            if update.source == source and (
                current is None or (current[0] == update.source and update.revision > current[1])
            ):
                accepted.append(update)
                newest[update.run_id] = (update.source, update.revision)
            else:
                rejected += 1
        if accepted:
            tables = self._tables.shadow if shadow else self._tables.live
            target = Target(conn, self.target.backend, tables, shadow, share.label)
            apply_batch = getattr(self.projection, "apply_batch", None)
            with self._projection_code("apply_batch" if apply_batch is not None else "apply"):
                if apply_batch is not None:
                    apply_batch(target, accepted)
                else:
                    for update in accepted:
                        self.projection.apply(target, update)
            table = _sql.run_revisions_shadow if shadow else _sql.run_revisions
            _sql.upsert_values(conn, self.target.backend, table, ("name", "run_id"), [
                (name, run_id, s, r) for run_id, (s, r) in newest.items()
            ])
        return len(accepted), rejected

    # ------------------------------------------------------------------ plumbing
    def _acquire(self) -> None:
        self._refuse_closed("acquire")
        _sources.refuse_closed(self._shares, "acquire")
        self._reach_target("acquire")
        self._lock.acquire(self._lock_timeout)
        self._prepare()

    def _reach_target(self, method: str) -> None:
        """Before the target's first use: connect once, so a target that cannot be reached is a
        ``ProjectionError`` saying why (``cannot_connect``, ``auth_failed``, ``database_missing`` ...,
        the codes of ``fencepost.open``) and naming the target with its password masked."""
        if self._reached:
            return
        try:
            self.target.make_dirs()  # a SQLite target's directories: a read reaches only a file that exists
        except OpenError as exc:
            raise self._unusable_target(method, exc.code, None, transient=False) from None
        try:
            found = self.target.connect_problem()
        except DbFailure as exc:  # the target ``Database`` was closed since the builder was made
            raise self._failure(exc, method) from None
        if found is not None:
            raise self._unusable_target(method, found.problem, found.code, found.note, transient=found.transient)
        self._reached = True

    def _unusable_target(self, method: str, problem: str, code: str | None, note: str | None = None, *,
                         transient: bool) -> ProjectionError:
        """The target's failure named like an open failure, with ``db_code`` and ``transient`` as
        every error from the database carries them (a server not accepting connections, a write
        lock held past the wait: True; a database that is not there, not a database: False)."""
        return _target_error(problem, method, self.target.open_detail(problem, note), code, transient)

    def _target_failure(self, exc: DbFailure, method: str, *, migrating: bool = False) -> ProjectionError:
        """A failure while preparing or first reading the target: named like an open failure when
        the driver's code says what is wrong with the database (not a database, missing ...). A
        refusal for want of rights while ``migrating`` names the pending migrations."""
        gone = self._target_replaced(exc, method)
        if gone is not None:
            return gone
        problem = self.target.backend.open_problem(exc.code)
        if problem is not None:
            note = permission_note(self.target, PROJECTIONS) if migrating and problem == "permission_denied" else None
            return self._unusable_target(method, problem, exc.code, note, transient=exc.transient)
        return map_failure(exc, ProjectionError, method, "projection target")  # type: ignore[return-value]

    def _prepare(self) -> None:
        if self._prepared and not self._recheck_tables and not self._tables_missing():
            return
        if not self._prepared:
            self._reach_target("prepare")
            blocked: OpenError | None = None
            try:
                migrate(self.target, ("projections",), again="the builder's next call applies it")
            except DbFailure as exc:
                raise self._target_failure(exc, "prepare", migrating=True) from None
            except OpenError as exc:  # ``migration_blocked``: named like every other unusable target
                blocked = exc
            if blocked is not None:
                raise _target_error(blocked.code, "prepare", blocked.detail, blocked.db_code,
                                    getattr(blocked, "transient", True))

        def body(conn: Connection) -> None:
            self._claim_tables(conn)
            found = self.target.backend.existing_tables(conn, [t.name for t in self._tables.all()])
            live_missing = any(t.name not in found for t in self._tables.live.values())
            shadow_missing = any(t.name not in found for t in self._tables.shadow.values())
            # A live table dropped after an odd number of rebuilds left its declared index names
            # on the shadow table (as did every swap of earlier versions): give them back first.
            self._tables.settle_index_names(conn)
            for table in self._tables.all():
                table.create(conn, checkfirst=True)
            self._tables.create_missing_indexes(conn)
            for share in self._shares:
                self._claim_checkpoint(conn, share)
                if live_missing or shadow_missing:
                    self._start_over(conn, share, live=live_missing)

        self._write(body, method="prepare")
        self._prepared = True
        self._recheck_tables = False

    def _tables_missing(self) -> bool:
        """Whether a table of the projection (live or shadow) is missing on the target: dropped since
        this builder prepared it. One catalog query (whatever the number of tables), at each call of
        ``catch_up``, ``rebuild``, ``offer`` and each pass of ``run``: a drop with nothing new to
        write would otherwise go unnoticed, the checkpoint reporting an absent read model as caught up."""
        names = [t.name for t in self._tables.all()]
        found = self._read(lambda conn: self.target.backend.existing_tables(conn, names))
        return not found.issuperset(names)

    def _start_over(self, conn: Connection, share: Share, *, live: bool) -> None:
        """Tables of the projection were missing (dropped on the target) and have just been created
        empty: a checkpoint that still counts their rows would report an empty read model as caught
        up, and a shadow fill would resume without its earlier pages. Build the share again from
        revision 0 (``live``), or restart its shadow fill."""
        cp = self._load_in(conn, share)
        backend, now = self.target.backend, self._now(share)
        if live and cp.source is not None:
            log.warning("projection %s: a table of the projection is missing on the target; building it again",
                        share.checkpoint)
            self._tables.reset_live(conn, backend, share)
            self._tables.reset(conn, backend, share)
            checkpoints.restart(conn, cp, now_ms=now)
            self._rebuild_begun(share, "table_missing")
        elif cp.shadow_source is not None and cp.shadow_reason is not None:
            self._tables.reset(conn, backend, share)
            checkpoints.start_shadow(conn, cp, source=cp.shadow_source, reason=cp.shadow_reason, now_ms=now)

    def _claim_tables(self, conn: Connection) -> None:
        """Record this projection as the keeper of its tables (live and shadow) on the target,
        refusing a table another projection name keeps: both would write, reset and swap its rows."""
        names = [table.name for table in self._tables.all()]
        owners = _sql.table_owners
        conn.execute(self.target.backend.insert(owners).values(
            [{"table_name": name, "projection": self.name} for name in names]
        ).on_conflict_do_nothing(index_elements=["table_name"]))
        kept = dict(conn.execute(select(owners.c.table_name, owners.c.projection).where(
            owners.c.table_name.in_(names))).all())
        for name in names:
            if kept.get(name) != self.name:
                raise ProjectionError("invalid_projection", "prepare",
                                      f"table {name!r} belongs to the projection {kept.get(name)!r} on the target; "
                                      "give this projection tables of its own")

    def _refuse_other_kind(self, conn: Connection, method: str) -> None:
        """For the read-only calls: refuse, as ``_claim_checkpoint`` does when preparing, a name that
        the other kind of projection holds on the target (a single-source checkpoint for a builder
        of several sources, source shares for a single-source one), instead of reporting it never
        built. A target without migration 3002 has no source shares."""
        if self.sources is not None:
            if checkpoints.load(conn, self.name) is not None:
                raise ProjectionError("invalid_projection", method,
                                      "a single-source projection holds this name on the target")
        elif checkpoints.load(conn, self.name) is None and self._shares_recorded() \
                and checkpoints.has_shares(conn, self.name):
            raise ProjectionError("invalid_projection", method,
                                  "a projection fed by several sources holds this name on the target")

    def _shares_recorded(self) -> bool:
        """Whether the target's checkpoints can record source shares (migration 3002 applied)."""
        return self._prepared or self._shares_migrated

    def _claim_checkpoint(self, conn: Connection, share: Share) -> None:
        """Create the share's checkpoint row, refusing a row or name that belongs to another builder.

        A single-source projection and one fed by several sources never share a name on a target:
        the rows of one would be read as the other's position.
        """
        if share.label is None:
            if checkpoints.share_of(conn, share.checkpoint) is not None or checkpoints.has_shares(conn, self.name):
                raise ProjectionError("invalid_projection", "prepare",
                                      "a projection fed by several sources holds this name on the target")
            cp = checkpoints.ensure(conn, self.target.backend, share.checkpoint, self._feed_kind, self._now(share))
        else:
            if checkpoints.load(conn, self.name) is not None:
                raise ProjectionError("invalid_projection", "prepare",
                                      "a single-source projection holds this name on the target")
            wanted = (self.name, share.label)
            if checkpoints.load(conn, share.checkpoint) is not None and \
                    checkpoints.share_of(conn, share.checkpoint) != wanted:
                raise ProjectionError("invalid_projection", "prepare",
                                      "another projection's checkpoint holds a source share's name on the target")
            cp = checkpoints.ensure(conn, self.target.backend, share.checkpoint, self._feed_kind, self._now(share),
                                    share=wanted)
        if cp.feed != self._feed_kind:
            raise ProjectionError(
                "invalid_projection", "prepare", "a projection of another feed kind holds this name on the target"
            )

    def _refuse_closed(self, method: str) -> None:
        # A closed builder has given its target's connections back: reading on would open new ones
        # that nothing closes any more.
        if self._closed.is_set():
            raise ProjectionError("projection_failed", method, "the builder is closed")

    def _target_ready(self) -> bool:
        if self._prepared:
            return True
        path = self.target.path
        if path is not None and not self._reached and not path.exists():
            return False  # never built; connecting would create the file
        self._reach_target("status")
        try:
            # The checkpoint tables (3001) are what a read needs; later migrations add columns only.
            missing = {m.id for m in pending(self.target, ("projections",))}
            self._shares_migrated = 3002 not in missing
            return 3001 not in missing
        except DbFailure as exc:
            raise self._target_failure(exc, "status") from None

    def _load_in(self, conn: Connection, share: Share) -> Checkpoint:
        cp = checkpoints.load(conn, share.checkpoint)
        if cp is None:
            raise ProjectionError("projection_failed", "load", "checkpoint row is missing on the target")
        return cp

    def _write(self, fn: Callable[[Connection], T], *, durable: bool = True, method: str = "apply") -> T:
        # Every write is made holding the lock: its PostgreSQL session may have ended since the call
        # began (a server restart, a terminated backend), and another builder may hold the name by
        # now. A lost lock is taken again when the name is free, else ``builder_busy``; the
        # checkpoint's compare-and-set covers the lock lost between this look and the commit.
        self._lock.acquire(self._lock_timeout)
        self._refused.what = None
        try:
            return self.target.write(fn, durable=durable)
        except DbFailure as exc:
            # The next call looks at the projection's tables again: a table dropped under the
            # builder is found (and built again) there instead of failing every page.
            self._recheck_tables = True
            refused, self._refused.what = self._refused.what, None
            if method == "prepare" and refused is None:
                # Its first write: a target the builder may read but not write (a read-only file, a
                # role without the rights) is named as ``fencepost.open`` names it.
                raise self._target_failure(exc, method) from None
            raise self._failure(exc, method, refused) from None

    def _read(self, fn: Callable[[Connection], T]) -> T:
        try:
            return self.target.read(fn)
        except DbFailure as exc:
            raise self._failure(exc, "read") from None

    def _failure(self, exc: DbFailure, method: str, refused: str | None = None) -> ProjectionError:
        """The builder's error for a failure of the target's database (``refused``: the projection's
        own code whose statement it was, see ``_projection_code``)."""
        return (self._target_replaced(exc, method) or self._own_table_gone(exc, method)
                or (self._projection_refused(exc, method, refused) if refused is not None else None)
                or map_failure(exc, ProjectionError, method, "projection target"))  # type: ignore[return-value]

    @contextmanager
    def _projection_code(self, what: str) -> Iterator[None]:
        """Around a call of the projection's own code (``apply``, ``apply_batch``, ``reset``) inside a
        write: a statement of it that the target refuses, other than a transient refusal the write
        retries, is remembered for ``_write``, which names it as the projection's. The store's words
        for such a failure speak of fencepost's tables and migrations, which never made these."""
        try:
            yield
        except DBAPIError as exc:
            if not self.target.backend.is_transient(exc):
                self._refused.what = what
            raise

    def _projection_refused(self, exc: DbFailure, method: str, what: str) -> ProjectionError:
        """The error for a statement of the projection's own ``what`` the target refused: its name,
        the driver's code and what fencepost knows of why, never a value."""
        why = "a table or column it uses is missing" if exc.reason == MISSING_OBJECT else exc.reason
        detail = (f"projection {self.name}: a statement of its own {what} was refused by the target "
                  f"(db code {exc.code or 'none'}{'; ' + why if why else ''}); nothing of that transaction "
                  "was written. If the projection's tables changed shape since the builder created them (a "
                  "column added, renamed or retyped), drop them on the target, each with its __shadow copy: "
                  "the builder creates them again and builds the projection anew")
        return carry_failure(ProjectionError(exc.category, method, detail), exc)

    @staticmethod
    def _target_replaced(exc: DbFailure, method: str) -> ProjectionError | None:
        """``projection_failed`` for a SQLite target file deleted, or replaced by another file, at its
        path since the builder opened it, else ``None``. Its connections keep the old file, which
        nobody can open any more: no retry reaches the file now at the path, so waiting (as ``run``
        waits an outage out) would retry for ever. A new builder opens that file and builds the
        projection onto it (from its own checkpoint, or from revision 0 in a new file)."""
        if exc.code != FILE_REPLACED:
            return None
        detail = ("projection target: the database file was deleted or replaced at its path after the builder "
                  "opened it; nothing was written. Close this builder and make a new ProjectionBuilder on the "
                  "target URL (run `fencepost projection run` again): it builds the projection onto the file "
                  "now at that path")
        err = carry_failure(ProjectionError("projection_failed", method, detail), exc)
        err.transient = False  # type: ignore[attr-defined]
        return err

    def _own_table_gone(self, exc: DbFailure, method: str) -> ProjectionError | None:
        """The error for a statement that met a missing table when that table is the projection's
        own (dropped while the builder used it), else ``None``.

        The store's words for a missing table point at ``migrations status``, but migrations never
        create a projection's tables: the builder does, and builds the projection again when it
        finds one missing (``table_missing``), at its next call."""
        if exc.reason != MISSING_OBJECT:
            return None
        names = [t.name for t in self._tables.all()]
        try:
            found = self.target.read(lambda conn: self.target.backend.existing_tables(conn, names))
        except DbFailure:
            return None
        gone = [name for name in names if name not in found]
        if not gone:
            return None  # a table migrations create (the checkpoints ...): the store's words hold
        detail = (f"projection target: table {gone[0]} of projection {self.name} is missing (dropped while the "
                  "builder used it); the builder creates it and builds the projection again at its next "
                  "catch-up or run (ProjectionBuilder.catch_up, fencepost projection run)")
        return carry_failure(ProjectionError("persistence_failed", method, detail), exc)

    def _take_turn(self, share: Share, method: str, stop: StopSignal | None = None) -> bool:
        """Wait until no other pass (a ``catch_up``, a ``rebuild``, a pass of ``run``, in any thread)
        works on ``share``, then hold it: the caller releases ``share.turn``. A call waits for the
        pass under way only (the loop's next pass waits for it) and raises ``projection_failed`` when
        the builder is closed meanwhile; ``run`` (given ``stop``) returns False, without the turn,
        once ``stop`` is set or the builder closed."""
        if stop is None:
            def closed() -> bool:
                self._refuse_closed(method)
                return False

            return share.turn.take(closed, caller=True)
        return share.turn.take(lambda: self._stopping(stop), caller=False)

    def _now(self, share: Share) -> int:
        return int(share.store.clock.now_ms())

    def _stopping(self, stop: StopSignal) -> bool:
        return stop.is_set() or self._closed.is_set()

    def _wait(self, wake: threading.Event, stop: StopSignal, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._stopping(stop):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or wake.wait(min(remaining, 0.05)):
                return

    def _watch(self, share: Share, wake: threading.Event, quit_watch: threading.Event) -> None:
        """Turn the feed's live follow into wake-ups; the poll in ``run`` covers any gap."""
        feed = share.store.feed
        # One wake-up per page of changes, not per change (a consensus projection keeps the change
        # follow it always woke on).
        pages = getattr(feed, "follow_batches", None) if self._feed_kind == "runs" else None
        listen = pages if pages is not None else getattr(feed, "follow", None)
        if listen is None:
            return
        while not quit_watch.is_set():
            try:
                updates = listen(feed.position(), stop=quit_watch)
                for _page in updates:
                    wake.set()
            except Exception:  # a rotation or an outage: wake the builder, retry later
                wake.set()
                quit_watch.wait(self.poll_interval)


# ---------------------------------------------------------------------- what ``offer`` takes
# A snapshot or fact handed to ``offer`` reaches the projection's own code and its tables, so it is
# held to the rules the feed's decoders hold a stored row to (``runstore._checks.decode_run_state``,
# ``changefeed.snapshot``, ``journal.replay.fact_problem``), on the fields they decode into: a
# wrong field is refused naming it (never its value), before the target is touched, alike on both
# backends, instead of failing inside the projection's write or being applied as it is.
_MS = "must be a non-negative safe integer"
_WAITING_KINDS = frozenset(get_args(WaitingKind))
_DIGEST = re.compile(r"[0-9a-f]{64}")


def _offered_problem(item: Any) -> str | None:
    """Why ``item`` (an ``Observed``, ``Missing`` or ``ConsensusFact``) is not one its feed could
    have delivered, as ``field rule``; None when it could have been."""
    p = identifier_problem(item.run_id)
    if p:
        return f"run_id {p}"
    if type(item.source) is not str or not SOURCE_SHAPE.fullmatch(item.source):
        return "source must be a source id (32 lowercase hex characters)"
    low = 0 if type(item) is Missing else 1  # a never-seen id carries the watermark, 0 in an empty store
    if not is_safe_int(item.revision) or item.revision < low:
        return f"revision must be a safe integer of at least {low}"
    if type(item) is Observed:
        return _observed_problem(item)
    if type(item) is Missing:
        return None if type(item.deleted) is bool else "deleted must be a bool"
    return _fact_problem(item)


def _observed_problem(s: Observed) -> str | None:
    status, owner, parent = s.status, s.owner, s.parent_run_id
    if type(status) is not str or status not in STATUSES:
        return "status is not a run status"
    if s.flow_name is not None and (type(s.flow_name) is not str or text_problem(s.flow_name)):
        return "flow_name must be a string without NUL or lone surrogates, or None"
    if not is_safe_int(s.created_at_ms):
        return f"created_at_ms {_MS}"
    for name, value in (("started_at_ms", s.started_at_ms), ("finished_at_ms", s.finished_at_ms)):
        if value is not None and not is_safe_int(value):
            return f"{name} {_MS}, or None"
    if parent is not None and (identifier_problem(parent) or parent == s.run_id):
        return "parent_run_id must be another run's id, or None"
    p = identifier_problem(s.lineage_id)
    if p:
        return f"lineage_id {p}"
    if not is_safe_int(s.round_ordinal):
        return f"round_ordinal {_MS}"
    if owner is not None:
        p = owner_problem(owner)
        if p:
            return f"owner {p}"
    if (owner is not None) != (status == "running"):  # the owner invariant
        return "owner must be set exactly when status is running"
    if s.cancellation is not None:
        p = _cancellation_problem(s.cancellation)
        if p:
            return f"cancellation{p}"
    if s.waiting is not None:
        p = _waiting_problem(s.waiting)
        if p:
            return f"waiting{p}"
    return None


def _cancellation_problem(c: Any) -> str | None:
    if type(c) is not Cancellation:
        return " must be a Cancellation, or None"
    if not is_safe_int(c.requested_at_ms):
        return f".requested_at_ms {_MS}"
    ack = c.acknowledgement
    if ack is None:
        return None
    if type(ack) is not Acknowledgement:
        return ".acknowledgement must be an Acknowledgement, or None"
    if not is_safe_int(ack.observed_at_ms):
        return f".acknowledgement.observed_at_ms {_MS}"
    p = owner_problem(ack.owner)
    return f".acknowledgement.owner {p}" if p else None


def _waiting_problem(w: Any) -> str | None:
    if type(w) is not Waiting:
        return " must be a Waiting, or None"
    if type(w.kind) is not str or w.kind not in _WAITING_KINDS:
        return ".kind is not a waiting kind"
    if type(w.reason) is not str or not w.reason or text_problem(w.reason):
        return ".reason must be a non-empty string without NUL or lone surrogates"
    if w.wake_at_ms is not None and not is_safe_int(w.wake_at_ms):
        return f".wake_at_ms {_MS}, or None"
    if w.token_digest is not None and (type(w.token_digest) is not str or not _DIGEST.fullmatch(w.token_digest)):
        return ".token_digest must be a SHA-256 hex digest, or None"
    p = value_problem(w.request)
    return f".request {p}" if p else None


def _fact_problem(f: ConsensusFact) -> str | None:
    if type(f.kind) is not str or text_problem(f.kind):
        return "kind must be a string without NUL or lone surrogates"
    owner = owner_of(f.owner)  # the feed passes on only facts whose owner replay can read
    if owner is None or owner_problem(owner):
        return "owner must be an owner object ({hostId, pid, nonce}) of a valid owner"
    if f.granted_at_ms is not None and not is_safe_int(f.granted_at_ms):
        return f"granted_at_ms {_MS}, or None"
    if not is_safe_int(f.emitted_at_ms):
        return f"emitted_at_ms {_MS}"
    return None
