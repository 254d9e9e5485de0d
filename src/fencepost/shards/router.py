"""The sharded store: N ordinary stores behind the ``runs``, ``attempts`` and ``journal`` surfaces.

Every call that names a run is routed to the one store that holds it; a run (with its attempts,
its journal stream and its companion stream) lives on exactly one shard, for life.

- **Where a run is created.** On the shard its id places on (``placement.place``), except a run
  created with a ``lineage_id`` or ``parent_run_id``: it joins the shard of that run, so a lineage
  and a fork's parent stay in one store (their constraints are the store's own). Every creation of
  an id holds its placed shard's write lock while it checks the other shards and creates the run
  (both locks in member order when the run goes elsewhere): creations of one id at once create it once.
- **Where an existing run is found.** Runs never move, so after a set grows some old runs are not
  where placement now points. A lookup asks the placed shard first, then the others in member
  order (a shard holds a run when it has its row, its journal stream or its companion stream of
  ownership facts), and remembers the answer (a run never changes shard). An id no shard knows is answered by
  the placed shard (``NotFound`` and friends, exactly as one store would).
- **No split on a stale process.** Creating a run re-reads the target shard's membership inside
  the creating transaction and refuses (``membership_changed``) when the set grew since this
  process opened it.

What is per shard: listing (``shards[name].feed.list_runs``), the journal's global log, change-feed
positions. ``changes()`` and ``follow()`` merge the shards' feeds, labelling each change with its
shard; order holds within one shard, never across shards. Nothing spans shards atomically:
``heartbeat_many`` is one transaction per shard, and a shard that fails does not stop the others
(its error names it and carries the committed shards' outcomes as ``results``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import msgspec
from sqlalchemy import bindparam, exists, literal, or_, select
from sqlalchemy.engine import Connection

from fencepost._durable import DbFailure, map_failure
from fencepost._schema import flows_journal_events as events_t
from fencepost._schema import flows_runs as runs_t
from fencepost._store import Store
from fencepost._store import open as open_store
from fencepost._values import identifier_problem
from fencepost.changefeed.types import Change, Position, StopSignal
from fencepost.clock import Clock, SystemClock
from fencepost.errors import FencepostError, JournalError, RunAlreadyExists
from fencepost.journal import COMPANION_PREFIX, Accepted, Duplicate, JournalTransaction, NewEntry, companion_stream
from fencepost.journal.owner import OwnerId
from fencepost.runstore import _checks as check
from fencepost.runstore._base import persistence_error
from fencepost.runstore.rows import Attempt
from fencepost.shards import _checks
from fencepost.shards import membership as ms
from fencepost.shards.membership import Membership, ShardError
from fencepost.shards.placement import place

# Whether a store holds a run (its row, its journal stream or its companion stream of ownership
# facts, which is all that is left of a run whose row was removed outside fencepost): built once.
# ``SELECT 1`` rather than ``exists()`` alone, which expands every column of the journal table on
# each call.
_HOLDS = select(or_(
    exists(select(literal(1)).where(runs_t.c.run_id == bindparam("run_id"))),
    exists(select(literal(1)).where(events_t.c.run_id.in_([bindparam("run_id"), bindparam("companion")]))),
))

__all__ = ["ShardChange", "ShardSet", "open_shards"]

T = TypeVar("T")
_CACHE_LIMIT = 100_000
_RUN_STORE_STREAMS = f"{COMPANION_PREFIX}run-store/"  # only the run store appends there (the journal refuses it)


class ShardChange(msgspec.Struct, frozen=True):
    """One change of a merged feed, labelled with the shard (store) it came from."""

    shard: str
    change: Change


class ShardSet:
    """Several stores, one per shard, used as one: ``runs``, ``attempts``, ``journal`` route by run id.

    ``shards[name]`` is the member ``Store`` (its own ``feed``, listing and journal log); ``names``
    is the member order. Open one with ``fencepost.open_shards``.
    """

    def __init__(self, stores: Mapping[str, Store], membership: Membership, *, clock: Clock) -> None:
        self._stores = dict(stores)
        self.names: tuple[str, ...] = tuple(stores)
        self.membership = membership
        self.clock = clock
        self._where: dict[str, str] = {}
        self._where_lock = threading.Lock()
        self.runs = ShardedRuns(self)
        self.attempts = ShardedAttempts(self)
        self.journal = ShardedJournal(self)

    # ------------------------------------------------------------------ members
    def __getitem__(self, name: str) -> Store:
        return self._stores[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def items(self) -> list[tuple[str, Store]]:
        """``(name, store)`` for every shard, in member order."""
        return [(n, self._stores[n]) for n in self.names]

    def shard_stores(self) -> list[Store]:
        """Every member store, in member order (what a ``Worker`` sweeps)."""
        return [self._stores[n] for n in self.names]

    # ------------------------------------------------------------------ placement and lookup
    def place(self, run_id: str) -> str:
        """The shard a NEW run with this id is created on (rendezvous hashing over the names).

        ``ShardError('invalid_run')`` for a value that is no valid run id, and for an id in the
        journal's reserved companion-stream namespace (``flows.companion/``), which no run can have:
        refused with the words ``runs.create`` refuses it with, as ``store_for`` refuses it.
        """
        return place(_checks.run_id_not_reserved(run_id, "place"), self.names)

    def locate(self, run_id: str) -> str:
        """The shard holding ``run_id`` (its run row, journal stream or companion stream), else the one it
        would be placed on.

        A ``run_id`` that is no valid run id raises ``ShardError('invalid_run')``. A companion stream's
        own id (``flows.companion/...``) is taken: it answers the shard holding that stream (how
        ``fencepost journal show`` finds it), where ``place`` and ``store_for`` refuse it. Before its
        run has a journal entry no shard holds that stream, and its id (a digest of the run's) is
        answered by placement, which may be another shard than the run's.
        """
        return self._route(_checks.run_id(run_id, "locate"))

    def _route(self, run_id: Any) -> str:
        """``locate`` for a routed call: an invalid id goes to the first shard, whose store refuses
        it exactly as it refuses it alone (with the routed call's own method name)."""
        if len(self.names) == 1 or identifier_problem(run_id):
            return self.names[0]
        found = self._find(run_id)
        return found if found is not None else place(run_id, self.names)

    def _find(self, run_id: str) -> str | None:
        """The shard holding ``run_id``, else ``None`` when every shard answered that it does not.

        A shard whose lookup fails does not stop the search: a run another shard holds is found
        there (a shard that is down is down for its own runs only). When no shard that answered
        holds it, the first failure is raised, its ``store`` naming that shard (it may hold the run).
        """
        known = self._where.get(run_id)
        if known is not None:
            return known
        failure: FencepostError | None = None
        for name in self._lookup_order(run_id):
            try:
                with _named_errors(name):
                    held = self._holds(self._stores[name], run_id)
            except FencepostError as exc:
                failure = failure if failure is not None else exc
                continue
            if held:
                self._remember(run_id, name)
                return name
        if failure is not None:
            raise failure
        return None

    def _lookup_order(self, run_id: str) -> list[str]:
        """The shards to ask for ``run_id``: the one it is placed on first, then member order."""
        placed = place(run_id, self.names)
        return [placed, *(n for n in self.names if n != placed)]

    def _held_elsewhere(self, run_id: str, target: str) -> None:
        """Raise ``_HeldElsewhere`` naming the first shard other than ``target`` (the placed shard first,
        then member order) that holds ``run_id``. Called under the placed shard's write lock: a
        creation of the id on any shard commits while holding it, so each shard read here shows
        every creation decided before (a shard whose transaction this thread has open is read in it)."""
        for name in self._lookup_order(run_id):
            if name == target:
                continue
            with _named_errors(name):
                held = self._holds(self._stores[name], run_id)
            if held:
                raise _HeldElsewhere(name)

    def store_for(self, run_id: str) -> Store:
        """The member store that holds (or would hold) ``run_id``.

        ``ShardError('invalid_run')`` for a value that is no valid run id, and for an id in the
        journal's reserved companion-stream namespace (``flows.companion/``), which no run can have:
        refused with the words ``runs.create`` refuses it with.
        """
        return self._stores[self._route(_checks.run_id_not_reserved(run_id, "store_for"))]

    @staticmethod
    def _holds(store: Store, run_id: str) -> bool:
        try:
            return bool(store.db.read(lambda conn: conn.execute(
                _HOLDS, {"run_id": run_id, "companion": companion_stream(run_id)}).scalar()))
        except DbFailure as exc:
            raise map_failure(exc, ShardError, "locate", "shard lookup") from None

    def _remember(self, run_id: str, name: str) -> None:
        with self._where_lock:
            if len(self._where) >= _CACHE_LIMIT:
                self._where.clear()
            self._where[run_id] = name

    def _check_generation(self, conn: Connection, name: str) -> None:
        found = ms.read_in(conn)
        if found != (self.membership.set_id, self.membership.generation):
            raise ShardError("membership_changed", "create",
                             f"shard #{self.names.index(name)} records another generation of this set: reopen it")

    # ------------------------------------------------------------------ merged change feed
    def positions(self) -> dict[str, Position]:
        """Every shard's current change-feed position (an error's ``store`` names the shard that failed)."""
        found: dict[str, Position] = {}
        for name, store in self.items():
            with _named_errors(name):
                found[name] = store.feed.position()
        return found

    def changes(self, positions: Mapping[str, Position | None] | None = None, *,
                limit: int = 500) -> Iterator[ShardChange]:
        """Every change after ``positions`` (per shard; missing shards start at revision 0), labelled.

        Shard by shard, each in revision order up to its watermark at the time it is read. A
        position of another source raises ``SourceChanged`` as a single store would. ``positions``
        other than ``None`` or a mapping of this set's shard names to a ``Position`` (or ``None``),
        and a ``limit`` (each shard's page size) outside 1..1000, raise
        ``ShardError('invalid_shards')`` at the call.
        """
        wanted = _checks.positions(positions, self.names, "changes")
        return merged_changes(self.items(), wanted, limit=_checks.limit(limit, "changes"))

    def follow(self, positions: Mapping[str, Position | None] | None = None, *, stop: StopSignal | None = None,
               poll_interval: float = 2.0) -> Generator[ShardChange, None, None]:
        """Follow every shard at once (one thread each) and yield their changes as they come, labelled.

        Each shard's changes keep their order; between shards there is none. Ends when ``stop`` is
        set; an error of any shard's follow (``SourceChanged`` ...) stops the others and is raised, its
        ``store`` naming that shard.
        ``positions`` are checked at the call, as ``changes`` checks them.
        """
        return merged_follow(self.items(), _checks.positions(positions, self.names, "follow"), stop=stop,
                             poll_interval=poll_interval)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close every member store."""
        for store in self._stores.values():
            store.close()

    def __enter__(self) -> ShardSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def merged_changes(stores: Iterable[tuple[str, Store]], positions: Mapping[str, Position | None] | None = None, *,
                   limit: int = 500) -> Iterator[ShardChange]:
    """The changes of several named stores after ``positions``, store by store, labelled with the name.

    Any stores will do (a shard set's members, or independent stores): revisions of two stores are
    never compared. A store missing from ``positions`` starts at revision 0 of its current source.
    """
    positions = dict(positions or {})
    for name, store in stores:
        with _named_errors(name):
            pos = positions.get(name) or Position(store.feed.position().source, 0)
        while True:
            with _named_errors(name):
                batch = store.feed.changes_since(pos, limit)
            for change in batch.changes:
                yield ShardChange(name, change)
            pos = Position(batch.source, batch.next_revision)
            if not batch.has_more:
                break


@contextmanager
def _named_errors(name: str) -> Iterator[None]:
    """A fencepost error raised inside carries the name of the store it came from (``store``)."""
    try:
        yield
    except FencepostError as exc:
        exc.store = name
        raise


def merged_follow(stores: Iterable[tuple[str, Store]], positions: Mapping[str, Position | None] | None = None, *,
                  stop: StopSignal | None = None, poll_interval: float = 2.0) -> Generator[ShardChange, None, None]:
    """Follow several named stores at once (a thread each), yielding their changes labelled as they come.

    Each store's changes keep their order; between stores there is none. Ends when ``stop`` is set;
    an error of any store's follow (``SourceChanged`` ...) stops the others and is raised, its
    ``store`` set to that store's name (as ``merged_changes`` does). A bad
    ``stop`` or ``poll_interval`` raises ``ValueError`` here, when the follow is called.
    """
    from fencepost.changefeed.follow import check_follow_arguments

    check_follow_arguments(stop, poll_interval)
    return _merged_follow(stores, positions, stop=stop, poll_interval=poll_interval)


def _merged_follow(stores: Iterable[tuple[str, Store]], positions: Mapping[str, Position | None] | None, *,
                   stop: StopSignal | None, poll_interval: float) -> Generator[ShardChange, None, None]:
    stop = stop if stop is not None else threading.Event()
    inner = threading.Event()
    out: queue.Queue[Any] = queue.Queue(maxsize=1000)
    positions = dict(positions or {})
    done = object()

    def hand_over(item: Any) -> bool:
        """Put ``item`` in the queue, unless the follow stops first (its consumer gone: a blocking
        put on the full queue would hold this thread for the life of the process)."""
        while not inner.is_set():
            try:
                out.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def pump(name: str, store: Store) -> None:
        try:
            with _named_errors(name):
                for change in store.feed.follow(positions.get(name), stop=inner, poll_interval=poll_interval):
                    if not hand_over(ShardChange(name, change)):
                        break
        except BaseException as exc:  # handed to the consumer, which raises it
            hand_over(exc)
        finally:
            hand_over(done)

    threads = [threading.Thread(target=pump, args=(n, s), daemon=True, name=f"fencepost-follow-{n}")
               for n, s in stores]
    for th in threads:
        th.start()
    running = len(threads)
    try:
        while running:
            if stop.is_set():
                return
            try:
                item = out.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is done:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        inner.set()
        for th in threads:
            th.join(timeout=5)


# How many times a creation goes to another shard than it looked on first (the id was found there,
# under the placed shard's lock): runs never move, so the second look finds what the first did.
_DIVERSIONS = 2


class _RoundMoved(Exception):
    """Raised in a retrying transaction: a round was added since the new round's id was read."""


class _HeldElsewhere(Exception):
    """Raised in a creating transaction: the shard ``name`` holds the id; the creation goes there."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _write(store: Store, fn: Callable[[Connection], T], *, alone: bool = False, method: str = "create") -> T:
    """``store.db.write(fn)``, a database failure mapped as ``runs.<method>`` maps it (``alone``: on
    this thread, never shared with other writes, so another store's write can run inside it)."""
    try:
        return store.db.write(fn, alone=alone)
    except DbFailure as exc:
        raise persistence_error(exc, method) from None


class _LockHolder:
    """One store's write lock, taken in a transaction of its own on a thread of its own and held
    until ``release``: for a creation whose target shard comes before the placed shard in member
    order, the placed shard's lock stays held until after the target's transaction committed
    (a write nested on this thread would commit before the one around it)."""

    def __init__(self, store: Store, method: str = "create") -> None:
        self._method = method
        self._locked = threading.Event()
        self._release = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._hold, args=(store,), daemon=True,
                                        name="fencepost-create-lock")
        self._thread.start()

    def _hold(self, store: Store) -> None:
        def body(_conn: Connection) -> None:
            self._locked.set()
            self._release.wait()

        try:
            store.db.write(body, alone=True)  # writes nothing: whether it commits does not matter
        except BaseException as exc:
            if not self._locked.is_set():
                self._failure = exc
        finally:
            self._locked.set()

    def wait(self) -> None:
        """Until the lock is held; the failure to take it (as ``runs.create`` maps it) raised here."""
        self._locked.wait()
        failure = self._failure
        if failure is not None:
            if isinstance(failure, DbFailure):
                raise persistence_error(failure, self._method) from None
            raise failure

    def release(self) -> None:
        self._release.set()
        self._thread.join()


def _let_go(holds: list[_LockHolder]) -> None:
    while holds:
        holds.pop().release()


class _Routed:
    def __init__(self, shards: ShardSet) -> None:
        self._shards = shards

    def _on(self, run_id: Any) -> Store:
        return self._shards[self._shards._route(run_id)]


class ShardedRuns(_Routed):
    """``RunStore`` of a shard set: each call runs on the shard holding its run."""

    def create(self, run_id: str, state_json: str, *, parent_run_id: str | None = None,
               lineage_id: str | None = None, round_ordinal: int | None = None) -> None:
        """Create on the placed shard (or the lineage's / parent's shard), checking the set's generation.

        Every creation of an id is decided on the shard the id is placed on: it holds that shard's
        write lock while it checks that no other shard holds the id and creates it, so creations of
        one id at once (with different anchors, or one with and one without) create it once. An id
        another shard holds is created there instead, which refuses it as one store does.
        """
        s = self._shards
        if identifier_problem(run_id):  # refused by the store exactly as it refuses it alone
            return s[s.names[0]].runs.create(run_id, state_json, parent_run_id=parent_run_id,
                                             lineage_id=lineage_id, round_ordinal=round_ordinal)
        anchor = lineage_id if lineage_id is not None else parent_run_id
        # ``place`` of the hashing itself: a reserved id is refused by the store's own create.
        placed = place(run_id, s.names)
        target = s._where.get(run_id)  # a run this process knows of: refused where it is
        if target is None:
            target = s._route(anchor) if anchor is not None and not identifier_problem(anchor) else placed

        def create(conn: Connection, target: str, look: bool) -> None:
            # In the target's write transaction, the placed shard's write lock held.
            s._check_generation(conn, target)
            if look:
                s._held_elsewhere(run_id, target)
            s[target].runs.create(run_id, state_json, parent_run_id=parent_run_id, lineage_id=lineage_id,
                                  round_ordinal=round_ordinal)

        for diversions in range(_DIVERSIONS, -1, -1):
            try:
                self._decided(placed, target, partial(create, target=target, look=diversions > 0))
            except _HeldElsewhere as held:
                target = held.name  # the creation goes to the shard holding the id, which refuses it
                continue
            s._remember(run_id, target)
            return

    def _decided(self, placed: str, target: str, create: Callable[[Connection], None],
                 method: str = "create") -> None:
        """``create`` in ``target``'s write transaction while ``placed``'s write lock is held, from
        before ``create`` looks until after ``target`` committed.

        The same shard: one transaction (its COMMIT shared with concurrent writes, as any write's).
        Otherwise both locks are taken in member order, so two creations never wait for each other
        crosswise: the placed shard first, then the target's transaction inside it (committed
        before the placed shard's); or the target first, and the placed shard's lock held on a
        thread of its own until the target's transaction committed.
        """
        s = self._shards
        store, placed_store = s[target], s[placed]
        if target == placed:
            _write(store, create, method=method)
        elif s.names.index(placed) < s.names.index(target):
            _write(placed_store, lambda _conn: _write(store, create, alone=True, method=method), alone=True,
                   method=method)
        else:
            holds: list[_LockHolder] = []

            def body(conn: Connection) -> None:
                _let_go(holds)  # a transaction run again: this thread holds the target's lock again
                holds.append(_LockHolder(placed_store, method))
                try:
                    holds[-1].wait()
                    create(conn)
                except BaseException:
                    _let_go(holds)  # never hold the placed shard's lock while taking the target's again
                    raise

            try:
                _write(store, body, alone=True, method=method)
            finally:
                _let_go(holds)

    def retry(self, run_id: str, *, new_run_id: str | None = None) -> Any:
        """``RunStore.retry`` of a shard set: a new round of ``run_id``'s lineage, created on the
        lineage's shard (a round carries the ``lineage_id``, so it joins that run's shard, as
        ``create`` places it), with the same outcomes and errors as one store's ``retry``.

        The new round's id (``new_run_id``, else ``"<lineage>.retry-<round>"``) is decided as a
        creation's is: under the write lock of the shard that id is placed on, no other shard may hold
        it. One held by another shard's run is ``RunAlreadyExists``; one whose journal stream another
        shard keeps (a deleted run's) is ``refused``, since the round would split that id's history
        across two shards.
        """
        s = self._shards
        if len(s.names) == 1 or identifier_problem(run_id) or (
                new_run_id is not None and identifier_problem(new_run_id)):
            # One store, or a call the store refuses before reading anything, exactly as it refuses it.
            return self._on(run_id).runs.retry(run_id, new_run_id=new_run_id)
        target = s._route(run_id)
        store = s[target]
        rid = new_run_id if new_run_id is not None else self._next_round_id(store, run_id)
        for _ in range(_DIVERSIONS + 1):
            if rid is None or identifier_problem(rid):
                # No such run, or a default id the store refuses: its own retry says so.
                return store.runs.retry(run_id, new_run_id=new_run_id)
            found: list[Any] = []

            def body(conn: Connection, rid: str = rid, found: list[Any] = found) -> None:
                # In the target's write transaction, the new id's placed shard's write lock held: no
                # round of the lineage can be added meanwhile, and no shard can create the id.
                s._check_generation(conn, target)
                if new_run_id is None and self._next_round_id(store, run_id) != rid:
                    raise _RoundMoved()  # a round was added since the id was read: read it again
                s._held_elsewhere(rid, target)
                found.append(store.runs.retry(run_id, new_run_id=new_run_id))

            try:
                self._decided(place(rid, s.names), target, body, "retry")
            except _RoundMoved:
                rid = self._next_round_id(store, run_id)
                continue
            except _HeldElsewhere as held:
                raise self._taken_elsewhere(held.name, rid) from None
            s._remember(found[0].run_id, target)
            return found[0]
        # Rounds keep being added by others: the store's own answer (it sees the latest round live).
        return store.runs.retry(run_id, new_run_id=new_run_id)

    @staticmethod
    def _next_round_id(store: Store, run_id: str) -> str | None:
        """The id ``store.runs.retry(run_id)`` would give its new round, or None when the store has no
        such run (its ``retry`` then refuses the call with its own words)."""
        try:
            latest = store.runs.latest_round(run_id)
        except FencepostError as exc:
            if exc.code == "not_found_row":
                return None
            raise
        return f"{latest.lineage_id or latest.run_id}.retry-{(latest.round_ordinal or 0) + 1}"

    def _taken_elsewhere(self, name: str, rid: str) -> FencepostError:
        """The error of a retry whose new id shard ``name`` holds: ``RunAlreadyExists`` when a run has
        it there (one store's answer), else ``refused`` (only the id's journal stream is there)."""
        try:
            self._shards[name].runs.get(rid)
        except FencepostError as exc:
            if exc.code != "not_found_row":
                raise
            return check.refuse("retry", f"the id's journal history is on shard {name!r} (a deleted run's), "
                                "and a new round is created on its lineage's shard: give another new_run_id",
                                {"field": "new_run_id"}, code="refused")
        return check.refuse("retry", "a run with this id already exists", {"field": "run_id"}, code="constraint",
                            cls=RunAlreadyExists)

    def get(self, run_id: str) -> Any:
        return self._on(run_id).runs.get(run_id)

    def lineage(self, run_id: str) -> Any:
        return self._on(run_id).runs.lineage(run_id)

    def delete(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        """``RunStore.delete`` on the shard holding ``run_id``."""
        return self._on(run_id).runs.delete(run_id, *args, **kwargs)

    def latest_round(self, run_id: str) -> Any:
        return self._on(run_id).runs.latest_round(run_id)

    def claim(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.claim(run_id, *args, **kwargs)

    def claim_and_own(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.claim_and_own(run_id, *args, **kwargs)

    def activate(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.activate(run_id, *args, **kwargs)

    def abandon_claim(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.abandon_claim(run_id, *args, **kwargs)

    def recover_claim(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.recover_claim(run_id, *args, **kwargs)

    def steal(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.steal(run_id, *args, **kwargs)

    def transition_owned(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.transition_owned(run_id, *args, **kwargs)

    def heartbeat(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.heartbeat(run_id, *args, **kwargs)

    def reconfirm(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.reconfirm(run_id, *args, **kwargs)

    def request_cancel(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.request_cancel(run_id, *args, **kwargs)

    def request_cancel_lineage(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.request_cancel_lineage(run_id, *args, **kwargs)

    def acknowledge_cancel(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).runs.acknowledge_cancel(run_id, *args, **kwargs)

    def heartbeat_many(self, owner: OwnerId, run_ids: Iterable[str], now_ms: int) -> dict[str, Any]:
        """One ``heartbeat_many`` per shard (one transaction each, never one across shards), merged in request order.

        Every shard is written, whichever fails: a shard that fails does not stop the others. When one
        does, its error is raised once all are done, with ``store`` naming it (the first to fail, if
        several did) and ``results`` holding the outcomes of the runs whose shards committed, in
        request order; a run missing from ``results`` was not heartbeated. With one shard the store's
        own ``heartbeat_many`` is called (no ``results``, ``store`` unset).
        """
        s = self._shards
        if len(s.names) == 1 or isinstance(run_ids, (str, bytes)) or not isinstance(run_ids, Iterable):
            return s[s.names[0]].runs.heartbeat_many(owner, run_ids, now_ms)
        given = list(run_ids)
        check.owner(owner, "heartbeat_many")
        for index, rid in enumerate(given):  # refuse the whole batch before any shard writes, as one store does
            check.run_id(rid, "heartbeat_many", f"run_ids[{index}]")
        ids = list(dict.fromkeys(given))
        groups: dict[str, list[str]] = {}
        failures: list[FencepostError] = []
        for rid in ids:
            try:
                name = s._route(rid)
            except FencepostError as exc:  # a lookup failed on a shard (named) that may hold the run
                failures.append(exc)
                continue
            groups.setdefault(name, []).append(rid)
        answers: dict[str, Any] = {}
        for name, group in groups.items():
            try:
                with _named_errors(name):
                    answers.update(s[name].runs.heartbeat_many(owner, group, now_ms))
            except FencepostError as exc:
                failures.append(exc)
        if failures:
            first = failures[0]
            first.results = {rid: answers[rid] for rid in ids if rid in answers}  # type: ignore[attr-defined]
            raise first
        return {rid: answers[rid] for rid in ids}


class ShardedAttempts(_Routed):
    """``AttemptStore`` of a shard set: each attempt lives on its run's shard."""

    def _of(self, attempt: Any) -> Store:
        return self._on(attempt.run_id if type(attempt) is Attempt else None)

    def put(self, attempt: Attempt, owner: OwnerId) -> Any:
        return self._of(attempt).attempts.put(attempt, owner)

    def finish(self, attempt: Attempt, owner: OwnerId) -> Any:
        return self._of(attempt).attempts.finish(attempt, owner)

    def get(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).attempts.get(run_id, *args, **kwargs)

    def of_run(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).attempts.of_run(run_id, *args, **kwargs)

    def heartbeat(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).attempts.heartbeat(run_id, *args, **kwargs)

    def patch(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).attempts.patch(run_id, *args, **kwargs)


class ShardedJournal(_Routed):
    """``Journal`` of a shard set: a stream lives on its run's shard; the global log is per shard."""

    def append(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).journal.append(run_id, *args, **kwargs)

    def append_unfenced(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).journal.append_unfenced(run_id, *args, **kwargs)

    def append_many(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).journal.append_many(run_id, *args, **kwargs)

    def append_many_unfenced(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._on(run_id).journal.append_many_unfenced(run_id, *args, **kwargs)

    def entries(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        """A stream's entries (a run's stream or a companion stream: both are found where they are)."""
        return self._on(run_id).journal.entries(run_id, *args, **kwargs)

    def transact(self, run_id: str, fn: Callable[[Any], T]) -> T:
        """``Journal.transact`` on the shard holding ``run_id``; every write in ``fn`` must concern that shard.

        A ``run_id`` that is no valid id is refused before ``fn`` runs (``invalid_event`` naming
        ``run_id``, as ``entries`` refuses it). An append through ``fn``'s transaction for a run that
        belongs to another shard (it holds the run, or a new run of that id is placed there: where
        ``journal.append`` would write it) is refused with ``invalid_event`` before it writes
        anything, like any refused append: its entry would sit where the set never reads that run's
        stream. Statements on ``tx.conn`` are the caller's to keep on this shard.
        """
        s = self._shards
        problem = identifier_problem(run_id)
        if problem:
            raise JournalError("invalid_event", "transact", f"run_id {problem}")
        if not callable(fn):  # refused by the store exactly as it refuses it alone
            return s[s.names[0]].journal.transact(fn)
        name = s._route(run_id)
        return s[name].journal.transact(lambda tx: fn(_ShardTransaction(tx, s, name, run_id)))


class _ShardTransaction(JournalTransaction):
    """The transaction ``ShardedJournal.transact`` hands its callable: appends only for runs of its shard."""

    def __init__(self, tx: JournalTransaction, shards: ShardSet, name: str, run_id: str) -> None:
        super().__init__(tx._journal, tx.conn)
        self._shards, self._name, self._run_id = shards, name, run_id

    def _run(self, run_id: str, entries: Sequence[NewEntry], owner: OwnerId | None, source_id: str, dedupe: str,
             method: str, *, fenced: bool) -> list[Accepted | Duplicate]:
        # A bad id, or one of the run store's companion streams, is left to the journal's own refusal.
        if run_id != self._run_id and not identifier_problem(run_id) and not run_id.startswith(_RUN_STORE_STREAMS):
            home = self._shards._route(run_id)
            if home != self._name:
                raise JournalError("invalid_event", method,
                                   f"run_id belongs to shard {home!r}, not to shard {self._name!r} of this "
                                   "transaction: append it outside the transaction (nothing was written)")
        return super()._run(run_id, entries, owner, source_id, dedupe, method, fenced=fenced)


def _named(urls: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(urls, Mapping):
        pairs = list(urls.items())
    elif isinstance(urls, (str, bytes)) or not isinstance(urls, Sequence):
        raise ShardError("invalid_shards", "open_shards", "urls must be a sequence of URLs or a mapping of name to URL")
    else:
        pairs = [(f"shard-{i}", u) for i, u in enumerate(urls)]
    if not pairs:
        raise ShardError("invalid_shards", "open_shards", "a shard set needs at least one store")
    named: dict[str, str] = {}
    for i, (name, url) in enumerate(pairs):
        ms.check_name(name, i)
        if type(url) is not str or not url:
            raise ShardError("invalid_shards", "open_shards", f"shard #{i} URL must be a non-empty string")
        if name in named:
            raise ShardError("invalid_shards", "open_shards", f"shard #{i} repeats the name of an earlier shard")
        named[name] = url
    return named


def open_shards(urls: Sequence[str] | Mapping[str, str], *, clock: Clock | None = None, attempt_policy: Any = None,
                readonly: bool = False, grow: bool = False) -> ShardSet:
    """Open (creating and migrating each store if needed) a shard set and check its recorded membership.

    ``urls`` is a list (shards named ``shard-0``, ``shard-1`` ... by position) or a mapping of
    name to URL, in member order. A fresh set (every store empty, none recording a set) is founded
    on first open. A set that does not match what its stores recorded — a shard missing, a new or
    extra store, another order or name, a store of another set — raises
    ``ShardError('membership_mismatch')`` and changes nothing. ``grow=True`` appends the new names
    to the set (every store records the longer list); existing runs stay.

    The arguments are checked first, then every store that exists is read read-only; only an open
    that passes both creates and migrates the stores that need it.
    """
    named = _named(urls)
    _checks.open_options(clock=clock, attempt_policy=attempt_policy, readonly=readonly, grow=grow)
    if not readonly:
        ms.check_before_creating(list(named), ms.look_all(list(named.values())), grow=grow)
    clock = clock if clock is not None else SystemClock()
    if not readonly:
        ms.clock_now(clock)  # a clock the membership stamps would refuse is refused before any store is created
    stores: dict[str, Store] = {}
    try:
        for name, url in named.items():
            stores[name] = open_store(url, clock=clock, attempt_policy=attempt_policy, readonly=readonly)
        # Two URLs of one database that the look could not tell apart (a store created meanwhile):
        # refused before any membership record is written.
        ms.check_distinct([None] * len(stores), [s.feed.position().source for s in stores.values()])
        membership = ms.reconcile(list(named), list(stores.values()), grow=grow, readonly=readonly)
        return ShardSet(stores, membership, clock=clock)
    except BaseException:
        for store in stores.values():
            store.close()
        raise
