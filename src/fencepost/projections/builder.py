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
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from sqlalchemy import MetaData, Table, delete, select
from sqlalchemy.engine import Connection

from fencepost import _gauges
from fencepost._durable import Database, DbFailure, map_failure
from fencepost._migrations import migrate, pending
from fencepost._values import identifier_problem
from fencepost.errors import FencepostError, ProjectionError, SourceChanged
from fencepost.projections import _sql, checkpoints
from fencepost.projections._feeds import ConsensusFeed, Page, RunsFeed
from fencepost.projections._lock import BuilderLock
from fencepost.projections.checkpoints import Checkpoint, CheckpointMoved, RebuildRecord
from fencepost.projections.protocol import Projection, Target

if TYPE_CHECKING:
    from fencepost._store import Store

T = TypeVar("T")
log = logging.getLogger("fencepost.projections")

MAX_PAGE = 1000  # changes_since refuses larger pages (REFERENCE 4)
_PARKED = "fencepost_projection_swap"  # a live table's name for the moment of a swap
_RETRIES = 50  # consecutive source races tolerated before giving up


class CatchUp(msgspec.Struct, frozen=True):
    """What one ``catch_up`` did: updates applied and rejected, whether it rebuilt, where it ended."""

    applied: int
    rejected: int
    rebuilt: bool
    revision: int


class ProjectionStatus(msgspec.Struct, frozen=True):
    """Where a projection stands against its source.

    ``source``/``applied_revision`` is what the projection reflects (``source`` is None before the
    first page); ``current_source``/``source_revision`` is the feed now. ``lag`` is the number of
    revisions (journal positions for a consensus projection) still to consume; while a rebuild is
    pending (``pending_rebuild`` names why) it is the whole source revision. ``applied`` (every
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


def _shadow_of(table: Table, metadata: MetaData) -> Table:
    shadow = table.to_metadata(metadata, name=f"{table.name}__shadow")
    # Index and constraint names are per schema (per database on SQLite): give the copies their own.
    for index in shadow.indexes:
        if index.name:
            index.name = f"{index.name}__shadow"
    for constraint in shadow.constraints:
        if isinstance(constraint.name, str) and constraint.name:
            constraint.name = f"{constraint.name}__shadow"
    return shadow


class ProjectionBuilder:
    """Keep ``projection`` on the database at ``target`` from the store ``source``.

    Parameters
    ----------
    source:
        The ``Store`` whose change feed (or journal, for a consensus projection) is consumed.
    target:
        A database URL (or an open ``Database``): the source's own database or another one, on
        either backend. The builder's tables (migration block ``projections``) and the projection's
        tables are created there if absent.
    projection:
        The read model (``RunsByStatus``, ``OwnershipHistory`` or your own ``Projection``).
    batch_size:
        Changes per page and per target transaction (1..1000).
    lock_timeout:
        Seconds to wait when another builder holds this projection name on this target: ``0``
        refuses at once with ``ProjectionError`` (code ``builder_busy``), ``None`` waits forever.
    poll_interval:
        Seconds between safety-net polls in ``run`` (and the back-off after a failed catch-up).
    """

    def __init__(
        self,
        source: Store,
        target: str | Database,
        projection: Projection,
        *,
        batch_size: int = 500,
        lock_timeout: float | None = 0.0,
        poll_interval: float = 1.0,
    ) -> None:
        problem = identifier_problem(getattr(projection, "name", None))
        if problem:
            raise ProjectionError("invalid_projection", "ProjectionBuilder", f"projection name {problem}")
        feed = getattr(projection, "feed", "runs")
        if feed not in ("runs", "consensus"):
            raise ProjectionError("invalid_projection", "ProjectionBuilder", "feed must be 'runs' or 'consensus'")
        tables = list(getattr(projection, "tables", ()))
        if not tables or not all(isinstance(t, Table) for t in tables):
            raise ProjectionError("invalid_projection", "ProjectionBuilder", "tables must be SQLAlchemy Tables")
        if type(batch_size) is not int or not 1 <= batch_size <= MAX_PAGE:
            raise ProjectionError("invalid_projection", "ProjectionBuilder", f"batch_size must be 1..{MAX_PAGE}")
        self.source = source
        self.projection = projection
        self.name: str = projection.name
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self._lock_timeout = lock_timeout
        self._owns_target = isinstance(target, str)
        self.target = Database(target) if isinstance(target, str) else target
        self._feed = ConsensusFeed(source) if feed == "consensus" else RunsFeed(source)
        self._feed_kind: str = feed
        shadow_md = MetaData()
        self._live = {t.name: t for t in tables}
        self._shadow = {t.name: _shadow_of(t, shadow_md) for t in tables}
        self._lock = BuilderLock(self.target, self.name)
        self._prepared = False
        # Marker of the transaction of the last shadow page this builder committed (see swap).
        self._shadow_marker: int | None = None
        self._closed = threading.Event()
        self._running = threading.Lock()
        # Test hook: called after each committed page with (shadow, page).
        self._after_page: Callable[[bool, Page], None] | None = None

    # ------------------------------------------------------------------ public surface
    def catch_up(self) -> CatchUp:
        """Apply everything up to the source's current revision, rebuilding first if it rotated.

        Returns the updates applied and rejected by this call, whether a rebuild was swapped in,
        and the revision the projection now reflects.
        """
        self._acquire()
        return self._catch_up()

    def rebuild(self) -> CatchUp:
        """Rebuild from revision 0 of the current source into a shadow copy, then swap it in."""
        self._acquire()
        source, _head = self._feed.head()

        def body(conn: Connection) -> None:
            cp = self._load_in(conn)
            self._reset_shadow(conn)
            checkpoints.start_shadow(conn, cp, source=source, reason="requested", now_ms=self._now())

        self._write(body)
        return self._catch_up()

    def run(self, stop: threading.Event | None = None) -> None:
        """Catch up, then follow the source until ``stop`` is set (or the builder is closed).

        Wake-ups come from the change feed's ``follow`` (watchfiles or LISTEN/NOTIFY); a poll every
        ``poll_interval`` seconds is the safety net. A database that is briefly unavailable is
        retried after ``poll_interval``; ``builder_busy`` and invalid projections propagate.
        """
        stop = stop if stop is not None else threading.Event()
        with self._running:
            self._run(stop)

    def _run(self, stop: threading.Event) -> None:
        self._acquire()
        wake = threading.Event()
        quit_watch = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(wake, quit_watch), daemon=True,
                                   name=f"projection-{self.name}-watch")
        watcher.start()
        try:
            while not self._stopping(stop):
                wake.clear()
                try:
                    self._catch_up()
                except (DbFailure, FencepostError) as exc:
                    # Only an unavailable database is waited out; every other error is a defect.
                    if isinstance(exc, FencepostError) and exc.code != "persistence_failed":
                        raise
                    log.warning("projection %s: catch-up failed (%s); retrying", self.name, type(exc).__name__)
                self._wait(wake, stop, self.poll_interval)
        finally:
            quit_watch.set()
            watcher.join(timeout=5)

    def status(self) -> ProjectionStatus:
        """Read the checkpoint and the source head: lag, rejected, rebuilds, last rebuild.

        Read-only on both sides: a target where this projection was never built (no tables, no
        checkpoint) reports ``source=None``, ``applied_revision=0`` and the whole source as lag.
        """

        def body(conn: Connection) -> tuple[Checkpoint | None, RebuildRecord | None]:
            return checkpoints.load(conn, self.name), checkpoints.last_rebuild(conn, self.name)

        cp, last = self._read(body) if self._target_ready() else (None, None)
        if cp is None:
            cp = Checkpoint(self.name, self._feed_kind, None, 0, None, 0, 0, 0, None, None, None, None, None, None, 0)
        source, head = self._feed.head()
        pending = self._pending_reason(cp, source, head)
        if pending is None and cp.source == source:
            lag = head - cp.revision
        else:
            lag = head
        return ProjectionStatus(
            name=self.name, feed=self._feed_kind, source=cp.source, applied_revision=cp.revision,
            current_source=source, source_revision=head, lag=lag, applied=cp.applied, rejected=cp.rejected,
            rebuilds=cp.rebuilds, pending_rebuild=pending, last_rebuild=last,
        )

    def rebuilds(self) -> list[RebuildRecord]:
        """Every completed rebuild of this projection on this target, oldest first (read-only)."""
        if not self._target_ready():
            return []
        return self._read(lambda conn: checkpoints.rebuild_log(conn, self.name))

    def offer(self, updates: Iterable[Any]) -> CatchUp:
        """Apply snapshots obtained elsewhere (``store.feed.read``), each only if it ``is_newer``.

        The checkpoint does not move; stale or foreign-source updates are rejected and counted.
        """
        self._acquire()
        items = list(updates)

        def body(conn: Connection) -> tuple[int, int]:
            cp = self._load_in(conn)
            if cp.source is None:
                return 0, len(items)
            accepted, rejected = self._apply_in(conn, cp.source, items, shadow=False)
            conn.execute(
                _sql.checkpoints.update().where(_sql.checkpoints.c.name == self.name).values(
                    applied=_sql.checkpoints.c.applied + accepted,
                    rejected=_sql.checkpoints.c.rejected + rejected,
                )
            )
            return accepted, rejected

        applied, rejected = self._write(body)
        return CatchUp(applied, rejected, False, self._read(self._load_in).revision)

    def close(self) -> None:
        """Stop ``run``, release the builder lock and the target's connections."""
        self._closed.set()
        # Let a ``run`` in another thread finish its page before the lock and engine go away.
        if self._running.acquire(timeout=60):
            self._running.release()
        _gauges.projection_lag.discard(projection=self.name)
        self._lock.release()
        if self._owns_target:
            self.target.dispose()

    def __enter__(self) -> ProjectionBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ catch-up and rebuild
    def _catch_up(self) -> CatchUp:
        applied = rejected = 0
        rebuilt = False
        races = 0
        while True:
            try:
                cp = self._read(self._load_in)
                source, head = self._feed.head()
                reason = self._pending_reason(cp, source, head)
                if reason is not None:
                    a, r = self._rebuild(cp, reason, source, head)
                    applied, rejected, rebuilt, races = applied + a, rejected + r, True, 0
                    continue
                page = self._feed.page(source, cp.revision, self.batch_size)
                a, r = self._commit(cp, page, shadow=False)
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
            _gauges.projection_lag.set(max(0, head - page.next_revision), projection=self.name)
            if not page.has_more:
                return CatchUp(applied, rejected, rebuilt, page.next_revision)

    def _pending_reason(self, cp: Checkpoint, source: str, head: int) -> str | None:
        if cp.source is not None:
            if cp.source != source:
                return "source_changed"
            if cp.revision > head:
                return "source_rewound"
            if cp.anchor is not None and self._feed.anchor_at(cp.revision) != cp.anchor:
                return "journal_diverged"
        return cp.shadow_reason

    def _rebuild(self, cp: Checkpoint, reason: str, source: str, head: int) -> tuple[int, int]:
        resumable = (
            cp.shadow_source == source
            and cp.shadow_revision is not None
            and cp.shadow_revision <= head
            and (cp.shadow_anchor is None or self._feed.anchor_at(cp.shadow_revision) == cp.shadow_anchor)
        )
        self._shadow_marker = None
        if not resumable:
            def start(conn: Connection) -> None:
                current = self._load_in(conn)
                if current != cp:
                    raise CheckpointMoved()
                self._reset_shadow(conn)
                checkpoints.start_shadow(conn, cp, source=source, reason=reason, now_ms=self._now())

            self._write(start)
            cp = self._read(self._load_in)
        applied = rejected = 0
        while True:
            assert cp.shadow_revision is not None
            page = self._feed.page(source, cp.shadow_revision, self.batch_size)
            a, r = self._commit(cp, page, shadow=True)
            applied, rejected = applied + a, rejected + r
            cp = self._read(self._load_in)
            if not page.has_more:
                break

        def swap(conn: Connection) -> None:
            current = self._load_in(conn)
            if current != cp:
                raise CheckpointMoved()
            backend = self.target.backend
            # The last shadow page's transaction, when this builder wrote it; else this one (all
            # shadow pages committed before it began), which is only more conservative.
            marker = self._shadow_marker if self._shadow_marker is not None else backend.write_marker(conn)
            if backend.renames_safe_after(conn, marker):
                # Exchange the tables' names (three renames, inside this transaction): the filled
                # shadow becomes the live table without copying a row, and the old live rows end
                # up in the shadow, emptied below. Indexes keep their own names, so index names
                # alternate between the two tables from one rebuild to the next.
                quote = conn.dialect.identifier_preparer.quote
                for name, live in self._live.items():
                    shadow = self._shadow[name]
                    for old, new in ((live.name, _PARKED), (shadow.name, live.name), (_PARKED, shadow.name)):
                        conn.exec_driver_sql(f"ALTER TABLE {quote(old)} RENAME TO {quote(new)}")
            else:
                # A reader holds a snapshot older than the shadow's last page (PostgreSQL): a
                # renamed table would show it a partial projection. Copy the rows instead, which
                # that reader cannot see until this commit, as it cannot see any of it.
                self.projection.reset(Target(conn, backend, self._live, False))
                for name, live in self._live.items():
                    shadow = self._shadow[name]
                    names = [c.name for c in live.columns]
                    conn.execute(live.insert().from_select(names, select(*[shadow.c[n] for n in names])))
            rl, rs = _sql.run_revisions, _sql.run_revisions_shadow
            conn.execute(delete(rl).where(rl.c.name == self.name))
            cols = [c.name for c in rl.columns]
            conn.execute(rl.insert().from_select(cols, select(*[rs.c[n] for n in cols]).where(rs.c.name == self.name)))
            self._reset_shadow(conn)
            checkpoints.swap_shadow(conn, cp, now_ms=self._now())

        self._write(swap)
        return applied, rejected

    def _reset_shadow(self, conn: Connection) -> None:
        self.projection.reset(Target(conn, self.target.backend, self._shadow, True))
        rs = _sql.run_revisions_shadow
        conn.execute(delete(rs).where(rs.c.name == self.name))

    def _commit(self, cp: Checkpoint, page: Page, *, shadow: bool) -> tuple[int, int]:
        expected_source = cp.shadow_source if shadow else (cp.source or page.source)
        if page.source != expected_source:
            raise CheckpointMoved()

        def body(conn: Connection) -> tuple[int, int]:
            accepted, rejected = self._apply_in(conn, page.source, page.updates, shadow=shadow)
            now = self._now()
            if shadow:
                self._shadow_marker = self.target.backend.write_marker(conn)
                checkpoints.advance_shadow(conn, cp, revision=page.next_revision, anchor=page.anchor,
                                           applied=accepted, rejected=rejected, now_ms=now)
            else:
                checkpoints.advance_live(conn, cp, source=page.source, revision=page.next_revision,
                                         anchor=page.anchor, applied=accepted, rejected=rejected, now_ms=now)
            return accepted, rejected

        result = self._write(body)
        if self._after_page is not None:
            self._after_page(shadow, page)
        return result

    def _apply_in(self, conn: Connection, source: str, updates: Sequence[Any], *, shadow: bool) -> tuple[int, int]:
        """Apply the updates that are newer than what is held, in order; return (applied, rejected)."""
        if not updates:
            return 0, 0
        held_stmt = _sql.held_shadow if shadow else _sql.held_live
        ids = msgspec.json.encode(list(dict.fromkeys(u.run_id for u in updates))).decode()
        held: dict[str, tuple[str, int]] = {
            run_id: (held_source, int(revision))
            for run_id, held_source, revision in conn.execute(held_stmt, {"name": self.name, "ids": ids}).all()
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
            target = Target(conn, self.target.backend, self._shadow if shadow else self._live, shadow)
            apply_batch = getattr(self.projection, "apply_batch", None)
            if apply_batch is not None:
                apply_batch(target, accepted)
            else:
                for update in accepted:
                    self.projection.apply(target, update)
            table = _sql.run_revisions_shadow if shadow else _sql.run_revisions
            name = self.name
            _sql.upsert_many(conn, self.target.backend, table, ("name", "run_id"), [
                {"name": name, "run_id": run_id, "source": s, "revision": r} for run_id, (s, r) in newest.items()
            ])
        return len(accepted), rejected

    # ------------------------------------------------------------------ plumbing
    def _acquire(self) -> None:
        if self._closed.is_set():
            raise ProjectionError("projection_failed", "acquire", "the builder is closed")
        self._lock.acquire(self._lock_timeout)
        self._prepare()

    def _prepare(self) -> None:
        if self._prepared:
            return
        try:
            migrate(self.target, ("projections",))
        except DbFailure as exc:
            raise map_failure(exc, ProjectionError, "prepare", "projection target") from None

        def body(conn: Connection) -> None:
            for table in [*self._live.values(), *self._shadow.values()]:
                table.create(conn, checkfirst=True)
            cp = checkpoints.ensure(conn, self.target.backend, self.name, self._feed_kind, self._now())
            if cp.feed != self._feed_kind:
                raise ProjectionError(
                    "invalid_projection", "prepare", "a projection of another feed kind holds this name on the target"
                )

        self._write(body)
        self._prepared = True

    def _target_ready(self) -> bool:
        if self._prepared:
            return True
        try:
            return not pending(self.target, ("projections",))
        except DbFailure as exc:
            raise map_failure(exc, ProjectionError, "status", "projection target") from None

    def _load_in(self, conn: Connection) -> Checkpoint:
        cp = checkpoints.load(conn, self.name)
        if cp is None:
            raise ProjectionError("projection_failed", "load", "checkpoint row is missing on the target")
        return cp

    def _write(self, fn: Callable[[Connection], T]) -> T:
        try:
            return self.target.write(fn)
        except DbFailure as exc:
            raise map_failure(exc, ProjectionError, "apply", "projection target") from None

    def _read(self, fn: Callable[[Connection], T]) -> T:
        try:
            return self.target.read(fn)
        except DbFailure as exc:
            raise map_failure(exc, ProjectionError, "read", "projection target") from None

    def _now(self) -> int:
        return int(self.source.clock.now_ms())

    def _stopping(self, stop: threading.Event) -> bool:
        return stop.is_set() or self._closed.is_set()

    def _wait(self, wake: threading.Event, stop: threading.Event, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._stopping(stop):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or wake.wait(min(remaining, 0.05)):
                return

    def _watch(self, wake: threading.Event, quit_watch: threading.Event) -> None:
        """Turn the feed's live follow into wake-ups; the poll in ``run`` covers any gap."""
        feed = self.source.feed
        pages = getattr(feed, "follow_batches", None) if self._feed_kind == "runs" else None
        follow = getattr(feed, "follow", None)
        if pages is None and follow is None:
            return
        while not quit_watch.is_set():
            try:
                # One wake-up per page of changes, not per change (a consensus projection keeps
                # the change follow it always woke on).
                updates = (pages(feed.position(), stop=quit_watch) if pages is not None
                           else follow(feed.position(), stop=quit_watch))
                for _page in updates:
                    wake.set()
            except Exception:  # a rotation or an outage: wake the builder, retry later
                wake.set()
                quit_watch.wait(self.poll_interval)
