"""The live tail: ``ChangeFeed.follow`` and ``afollow``.

A follower pages ``changes_since`` until it is caught up, then sleeps until a *hint* says the
database may have changed, or until the fallback poll is due, and pages again. Hints never carry
data and may be lost, duplicated or spurious; the query on ``revision > position`` is the only
truth (PITFALLS "LISTEN/NOTIFY is a hint"):

* SQLite: watchfiles watches the database's directory for writes to the database, ``-wal`` or
  ``-journal`` file; each event (and each poll) is confirmed with ``PRAGMA data_version`` on a
  connection the follower keeps, which changes exactly when another connection committed, so file
  noise (checkpoints, other files) costs one pragma and no page query.
* PostgreSQL: a dedicated autocommit psycopg connection ``LISTEN``s on ``fencepost_changes_v1``
  (sent by the 2001 migration's triggers with the schema as payload). After any reconnect the
  follower re-queries, since notifications sent while it was away are gone.

The hint is cleared (and on SQLite the data version sampled) *before* each page query, so a commit
that lands after the query's snapshot always leaves a hint behind: no missed wake-up. Database
failures (a restarting server, a busy file) are retried with capped backoff from the same position.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Generator
from typing import TYPE_CHECKING, Any

from fencepost import _gauges
from fencepost._dialects import PG_CONNECT_TIMEOUT_S, replacement_check
from fencepost._durable import pg_session_name, store_closed
from fencepost._values import seconds_problem, stop_problem
from fencepost.changefeed.types import Change, ChangePage, Position, StopSignal
from fencepost.errors import FencepostError, SourceChanged

if TYPE_CHECKING:
    from fencepost.changefeed.feed import ChangeFeed

log = logging.getLogger("fencepost.changefeed")

CHANNEL = "fencepost_changes_v1"
PAGE = 500
STOP_SLICE = 0.1  # how often a waiting follower looks at its stop event (no query involved)
MAX_BACKOFF = 5.0
#: Seconds a follower's reads go on failing before it says so at WARNING (it retries throughout):
#: a database gone for good (a dropped schema) must not look like a quiet, healthy follow.
UNAVAILABLE_WARN_S = 10.0
SETTLE = (0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)  # re-confirmations after an unconfirmed hint


class _Never:
    def is_set(self) -> bool:
        return False


class _StoreClosed:
    """Set once the store is closed: what ends a follower's own threads (its watcher or listener,
    an ``afollow``'s thread) even while nothing runs the follower itself (its consumer holds it
    between changes), so ``Store.close()`` releases their connections at once."""

    __slots__ = ("_db",)

    def __init__(self, db: Any) -> None:
        self._db = db

    def is_set(self) -> bool:
        return bool(self._db.closed)


class _Either:
    def __init__(self, *events: StopSignal) -> None:
        self.events = events

    def is_set(self) -> bool:
        for e in self.events:  # asked before every change a follower yields: no generator per call
            if e.is_set():
                return True
        return False


def _sleep(seconds: float, stop: StopSignal) -> None:
    deadline = time.monotonic() + seconds
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(STOP_SLICE, left))


class _Waiter:
    """Base waiter: no hints at all, only the fallback poll."""

    def check_source(self) -> None:
        """Raise ``SourceChanged`` when what is followed is no longer the store the follower started on."""

    # Re-confirmation delays after a hint that ``changed()`` did not confirm (SQLite only).
    settle: tuple[float, ...] = ()

    def __init__(self, db: Any = None) -> None:
        self.hint = threading.Event()
        self.hint_at = float("-inf")
        self._db = db  # the store's database: a closed store ends the wait (its next page says so)

    def note_hint(self) -> None:
        """Called by the hint source (a watcher thread): something may have committed."""
        self.hint_at = time.monotonic()
        self.hint.set()

    def before_query(self) -> None:
        self.hint.clear()

    def changed(self) -> bool:
        """Confirm a hint (or a due poll): True means "page again"."""
        return True

    def _rechecks(self, now: float) -> list[float]:
        return [t for t in (self.hint_at + d for d in self.settle) if t > now]

    def wait(self, stop: StopSignal, poll_interval: float) -> None:
        deadline = time.monotonic() + poll_interval
        # A hint consumed just before the last query may belong to a commit that was not yet
        # visible to it: keep confirming for a moment after every hint, not only after new ones.
        rechecks = self._rechecks(time.monotonic())
        while not stop.is_set():
            if self._db is not None and self._db.closed:
                return
            now = time.monotonic()
            if now >= deadline:
                if self.changed():
                    return
                deadline = now + poll_interval
                continue
            if rechecks and now >= rechecks[0]:
                rechecks.pop(0)
                if self.changed():
                    return
                continue
            timeout = min(STOP_SLICE, deadline - now, rechecks[0] - now if rechecks else STOP_SLICE)
            if self.hint.wait(timeout):
                self.hint.clear()
                if self.changed():
                    return
                rechecks = self._rechecks(time.monotonic())

    def close(self) -> None:
        pass


class _SqliteWaiter(_Waiter):
    # SQLite writes the WAL frames (the file event), syncs, and only then publishes the commit in
    # shared memory, which raises no file event: an event can precede the commit's visibility.
    settle = SETTLE

    def __init__(self, feed: ChangeFeed) -> None:
        db = feed._store.db
        super().__init__(db)
        self._conn: Any = None
        self._version: int | None = None
        self._conn_lock = threading.Lock()  # the follower's thread uses ``_conn``, the watcher releases it
        self._closed = threading.Event()
        self._done = _Either(self._closed, _StoreClosed(db))  # ``close()``, or the store closed
        path = str(db.path)  # absolute since the store opened (a chdir since changes nothing)
        self._path = path
        # The file this follower reads (a writable store's own, even when it was replaced before
        # this follow began: its reads would otherwise fail and be retried for ever).
        self._replaced = replacement_check(db.backend, path)
        self._names = {os.path.basename(path) + suffix for suffix in ("", "-wal", "-journal")}
        self._thread = threading.Thread(
            target=self._watch, args=(os.path.dirname(path),), name="fencepost-follow-watch", daemon=True
        )
        self._thread.start()

    def _watch(self, directory: str) -> None:
        try:
            import watchfiles

            names = self._names
            ready = False
            # yield_on_timeout: the first (possibly empty) yield proves the OS watch is registered.
            # Commits that landed before that moment raised no event, so that first yield is a hint
            # too: it makes the follower compare PRAGMA data_version with its last baseline.
            for changes in watchfiles.watch(
                directory,
                watch_filter=lambda _change, p: os.path.basename(p) in names,
                debounce=20,
                step=1,
                stop_event=self._done,
                recursive=False,
                rust_timeout=100,
                yield_on_timeout=True,
            ):
                if changes or not ready:
                    ready = True
                    self.note_hint()
        except Exception:  # no watcher (inotify limits ...): the poll still runs
            if not self._done.is_set():
                log.warning("change-feed file watcher stopped; relying on the fallback poll", exc_info=True)
            # Still the one to release the connection below when the store closes.
            _sleep(float("inf"), self._done)
        finally:
            if self._db.closed:
                # The store closed, perhaps while the follower is suspended between changes (its
                # consumer holds it): nothing else would release the connection it keeps.
                with self._conn_lock:
                    self._drop()

    def _data_version(self) -> int | None:
        with self._conn_lock:
            try:
                if self._conn is None:
                    # Outside the pool, as the PostgreSQL listener's: a follower keeps it while it
                    # lives, and the pool's connections are for transactions (any number of
                    # followers leave them free). A closed store refuses it (the next page says so).
                    self._conn = self._db.detached_connection()
                try:
                    return int(self._conn.exec_driver_sql("PRAGMA data_version").scalar())
                finally:
                    self._conn.rollback()
            except Exception:  # an unusable connection: drop it and page to be safe
                self._drop()
                return None

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:
                pass

    def check_source(self) -> None:
        if self._replaced():
            raise SourceChanged(
                "invalid_run", "follow", "the database file was replaced or removed under the follower: rebuild"
            )

    def before_query(self) -> None:
        super().before_query()
        self._version = self._data_version()

    def changed(self) -> bool:
        # A replaced file raises no data_version change on the old file's connection: wake up, and
        # ``check_source`` before the next query reports it.
        # A closed store: page again, and the page reports it (the follower ends).
        if self._version is None or self._db.closed or self._replaced():
            return True
        return self._data_version() != self._version

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        with self._conn_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass


class _PostgresWaiter(_Waiter):
    def __init__(self, feed: ChangeFeed) -> None:
        db = feed._store.db
        super().__init__(db)
        self._schema = db.schema
        # The store's own connection parameters, as its engine turns its URL into them (the URL
        # rendered again as text would write a space in a query value as ``+``, which libpq keeps:
        # ``options=-c statement_timeout=0`` was refused by the server). Not SQLAlchemy's adapters.
        self._params: dict[str, Any] = {
            k: v for k, v in db.engine.dialect.create_connect_args(db.engine.url)[1].items() if k != "context"}
        # Named apart from the store's own sessions unless the user names them all (the URL, PGAPPNAME).
        self.application_name = f"fencepost-follow-{self._schema}"[:63]
        self._name = pg_session_name(db.engine.url.query, self.application_name)
        # The store's own wait for a new connection: the URL's connect_timeout, else fencepost's default.
        self._timeout: dict[str, Any] = (
            {} if "connect_timeout" in db.engine.url.query else {"connect_timeout": PG_CONNECT_TIMEOUT_S})
        self._closed = threading.Event()
        # ``close()``, or the store closed: the listener ends (and its session with it) even while
        # the follower is suspended between changes and nothing calls ``close()``.
        self._done = _Either(self._closed, _StoreClosed(db))
        self._conn: Any = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._listen, name="fencepost-follow-listen", daemon=True)
        self._thread.start()

    def _connect(self) -> Any:
        import psycopg

        conn = psycopg.connect(**{**self._params, **self._name, **self._timeout}, autocommit=True)
        # The session sits idle by design (it waits for notifications): a role's
        # idle_session_timeout (PostgreSQL 14+) would end it at every timeout, and each reconnect
        # re-reads the feed. Off for this session alone.
        if conn.info.server_version >= 140000:
            conn.execute("SET idle_session_timeout = 0")
        conn.execute(f"LISTEN {CHANNEL}")  # last: the session shows it as its query
        return conn

    def _listen(self) -> None:
        backoff = 0.05
        while not self._done.is_set():
            try:
                conn = self._connect()
            except Exception:  # server down or restarting: try again later
                _sleep(backoff, self._done)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            with self._lock:
                self._conn = conn
            backoff = 0.05
            # Notifications sent while we were not listening are lost: page once now.
            self.note_hint()
            try:
                while not self._done.is_set():
                    for note in conn.notifies(timeout=STOP_SLICE):  # close() waits for this slice
                        if note.payload == self._schema:
                            self.note_hint()
            except Exception:  # connection lost: reconnect and re-query
                if not self._done.is_set():
                    log.info("change-feed listener lost its connection; reconnecting")
                self.note_hint()
            finally:
                with self._lock:
                    self._conn = None
                try:
                    conn.close()
                except Exception:
                    pass

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)


def _make_waiter(feed: ChangeFeed) -> _Waiter:
    name = feed._store.db.backend.name
    if name == "sqlite":
        return _SqliteWaiter(feed)
    if name == "postgresql":
        return _PostgresWaiter(feed)
    return _Waiter()  # pragma: no cover - only two backends exist


def _retryable(exc: FencepostError) -> bool:
    # A failed read is worth retrying; a source change, a corrupt row or a closed store is the
    # caller's to handle.
    return not isinstance(exc, SourceChanged) and exc.code == "persistence_failed" and not store_closed(exc)


MAX_POLL_INTERVAL = 3600.0


def check_follow_arguments(stop: object, poll_interval: object) -> None:
    """The one check of every follow's ``stop`` and ``poll_interval`` (``follow``, ``follow_batches``,
    ``afollow`` and the merged follow of several stores), made when the follow is called: a
    ``ValueError`` naming the argument."""
    problem = stop_problem(stop)
    if problem:
        raise ValueError(f"stop {problem}")
    problem = seconds_problem(poll_interval, allow_zero=False, maximum=MAX_POLL_INTERVAL)
    if problem:
        raise ValueError(f"poll_interval {problem}")


class _Ready:
    """What a follower already holds: ``left`` changes of its current page not yet yielded, each of
    which the next ``next()`` returns without a query or a wait (``afollow`` takes them all in one
    hand-over to the event loop)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = 0


def follow(
    feed: ChangeFeed, position: Position | None, *, stop: StopSignal | None, poll_interval: float,
    ready: _Ready | None = None,
) -> Generator[Change, None, None]:
    """Generator behind ``ChangeFeed.follow`` (see its docstring for the contract).

    ``ready`` (``afollow``'s) is kept up to date with the changes the follower holds unyielded.
    """
    check_follow_arguments(stop, poll_interval)
    halt: StopSignal = stop if stop is not None else _Never()
    if position is not None:
        # Refuse a malformed position now, not at the first page (decode_failed).
        from fencepost.changefeed.feed import _check_requested_position

        _check_requested_position(position, "follow")
    return _follow(feed, position, halt, float(poll_interval), ready)


def _follow(
    feed: ChangeFeed, position: Position | None, stop: StopSignal, poll_interval: float,
    ready: _Ready | None = None,
) -> Generator[Change, None, None]:
    pages = _pages(feed, position, stop, poll_interval, lambda p: feed.changes_since(p, PAGE))
    try:
        for batch in pages:
            last = len(batch.changes) - 1
            for i, change in enumerate(batch.changes):
                if stop.is_set():
                    return
                if ready is not None:
                    ready.left = last - i
                yield change
    finally:
        pages.close()  # releases the waiter's watcher and connections now, not at collection


def follow_batches(
    feed: ChangeFeed, position: Position | None, *, stop: StopSignal | None, poll_interval: float, limit: int
) -> Generator[ChangePage, None, None]:
    """Generator behind ``ChangeFeed.follow_batches`` (see its docstring for the contract)."""
    check_follow_arguments(stop, poll_interval)
    from fencepost.changefeed.feed import MAX_CHANGES_LIMIT, _check_requested_position, _decode_failed

    if type(limit) is not int or not 1 <= limit <= MAX_CHANGES_LIMIT:
        raise _decode_failed("follow_batches", f"limit must be an integer in 1..{MAX_CHANGES_LIMIT}")
    if position is not None:
        _check_requested_position(position, "follow_batches")
    halt: StopSignal = stop if stop is not None else _Never()
    return _nonempty(_pages(feed, position, halt, float(poll_interval),
                            lambda p: feed.changes_with_snapshots(p, limit)))


def _nonempty(pages: Generator[ChangePage, None, None]) -> Generator[ChangePage, None, None]:
    try:
        for page in pages:
            if page.changes:
                yield page
    finally:
        pages.close()


def _pages(feed: ChangeFeed, position: Position | None, stop: StopSignal, poll_interval: float,
           fetch: Callable[[Position], Any]) -> Generator[Any, None, None]:
    """Every page ``fetch`` returns from ``position`` on, waiting for a hint or the poll when caught up."""
    waiter = _make_waiter(feed)
    backoff = 0.05
    follower = _gauges.next_follower()
    source: str | None = None
    outage: float | None = None  # when the current run of failed reads began (monotonic)
    warned = False
    try:
        while not stop.is_set():
            waiter.check_source()
            waiter.before_query()
            try:
                if position is None:
                    position = Position(feed.position().source, 0)
                batch = fetch(position)
            except FencepostError as exc:
                if not _retryable(exc):
                    raise
                now = time.monotonic()
                outage = now if outage is None else outage
                if not warned and now - outage >= UNAVAILABLE_WARN_S:
                    warned = True
                    log.warning("change-feed follow: the database has not answered for %.0f s (%s); "
                                "still retrying", now - outage, getattr(exc, "db_code", None) or exc.code)
                else:
                    log.info("change-feed follow: database unavailable, retrying in %.2fs", backoff)
                _sleep(backoff, stop)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            if warned and outage is not None:
                log.warning("change-feed follow: the database answers again after %.0f s",
                            time.monotonic() - outage)
            outage, warned = None, False
            backoff = 0.05
            reached = batch.next_position
            if source is not None and source != reached.source:
                _gauges.feed_position.discard(source=source, follower=follower)
            source = reached.source
            _gauges.feed_position.set(reached.revision, source=source, follower=follower)
            yield batch
            if stop.is_set():
                return
            position = reached
            if not batch.has_more:
                waiter.wait(stop, poll_interval)
    finally:
        if source is not None:
            _gauges.feed_position.discard(source=source, follower=follower)
        waiter.close()


#: The most changes one hand-over from an ``afollow``'s thread carries to the event loop: those of
#: the page the follower holds, never more (its memory stays one page, as ``follow``'s).
HANDOVER = PAGE


def afollow(
    feed: ChangeFeed, position: Position | None, *, stop: StopSignal | None, poll_interval: float
) -> AsyncGenerator[Change, None]:
    """Async generator behind ``ChangeFeed.afollow``: the blocking follower runs on a thread of its own.

    ``stop`` may be a ``threading.Event`` or an ``asyncio.Event``. Leaving the ``async for`` (break,
    cancellation) stops the thread within ``STOP_SLICE`` seconds and releases its connections; the
    event loop never waits for that, and the loop's default executor is never used, so any number
    of followers leave ``asyncio.to_thread`` free for the rest of the program.
    Bad arguments are refused here, when ``afollow`` is called, not at the first iteration.
    """
    check_follow_arguments(stop, poll_interval)
    if position is not None:
        from fencepost.changefeed.feed import _check_requested_position

        _check_requested_position(position, "afollow")
    return _afollow(feed, position, stop=stop, poll_interval=poll_interval)


#: One hand-over: the changes, whether the follower ended after them, and what it raised after them.
_Handover = tuple[list[Change], bool, BaseException | None]


def _settle(future: asyncio.Future[_Handover], handover: _Handover) -> None:
    if not future.cancelled():  # the consumer left while the thread was working: nothing to hand over
        future.set_result(handover)


class _Pump:
    """One daemon thread that takes changes from a blocking follower, one batch per request of the loop.

    A request takes the next change (waiting for it if need be) and every further change the
    follower already holds (the rest of its page, ``ready.left``), up to ``HANDOVER``: a backlog
    crosses to the loop a page per round trip, a live change as soon as it is read. Nothing is
    read ahead of a request: the follower pages on only when the consumer has taken everything.

    The thread, not the loop, runs the iterator's ``close()`` (which joins the follower's watcher or
    listener thread), and it ends once the iterator is exhausted, has failed or was closed: its
    per-thread database connections then return to the pool. It also ends when the store is closed
    while no request is pending (the consumer holds the generator between changes): it then reads
    what the follower still holds and the error that ends it (the store is closed), keeps that for
    the next request, and ends at once, so ``Store.close()`` leaves no thread or session behind.
    """

    def __init__(self, it: Generator[Change, None, None], ready: _Ready, db: Any) -> None:
        self._it = it
        self._ready = ready
        self._store_closed = _StoreClosed(db)
        self._requests: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[_Handover]] | None] = (
            queue.SimpleQueue())
        # The last hand-over, kept once the thread has ended on its own (the store closed) for the
        # request that comes next; ``_lock`` orders that with a request being made meanwhile.
        self._final: _Handover | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="fencepost-afollow", daemon=True).start()

    def _take(self) -> _Handover:
        changes: list[Change] = []
        try:
            changes.append(next(self._it))
            while self._ready.left > 0 and len(changes) < HANDOVER:
                changes.append(next(self._it))
        except StopIteration:
            return changes, True, None
        except BaseException as exc:  # handed to the consumer, raised from its ``async for`` after ``changes``
            return changes, True, exc
        return changes, False, None

    def _run(self) -> None:
        try:
            while True:
                try:
                    request = self._requests.get(timeout=STOP_SLICE)
                except queue.Empty:
                    if self._store_closed.is_set():
                        self._end_closed()
                        return
                    continue
                if request is None:
                    return
                loop, future = request
                handover = self._take()
                try:
                    loop.call_soon_threadsafe(_settle, future, handover)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    return
                if handover[1]:
                    return
        finally:
            self._it.close()

    def _end_closed(self) -> None:
        """The store was closed while nobody asked for a change: take what the follower still holds
        and the error it ends with (its next page finds the store closed) now, for the next request."""
        changes: list[Change] = []
        ended, error = False, None
        while not ended:  # the rest of the follower's page, then its end (no page can be read now)
            more, ended, error = self._take()
            changes.extend(more)
        handover: _Handover = (changes, True, error)
        with self._lock:
            request = None
            while request is None:  # a request made meanwhile gets it; a close request needs nothing
                try:
                    request = self._requests.get_nowait()
                except queue.Empty:
                    break
            if request is None:
                self._final = handover
                return
        loop, future = request
        try:
            loop.call_soon_threadsafe(_settle, future, handover)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    async def next(self) -> _Handover:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Handover] = loop.create_future()
        with self._lock:
            final = self._final
            if final is not None:  # the thread has ended: this is the follower's last hand-over
                self._final = ([], True, None)
                return final
            self._requests.put((loop, future))
        return await future

    def close(self) -> None:
        self._requests.put(None)


class _Owner:
    """An object only an ``afollow`` generator's frame holds: collected with the generator."""

    __slots__ = ("__weakref__",)


def _stop_pump(inner: threading.Event, pump: _Pump) -> None:
    # The thread sees ``inner`` within STOP_SLICE, returns from the wait and closes the follower.
    inner.set()
    pump.close()


async def _afollow(
    feed: ChangeFeed, position: Position | None, *, stop: StopSignal | None, poll_interval: float
) -> AsyncGenerator[Change, None]:
    inner = threading.Event()
    halt = _Either(inner, stop) if stop is not None else inner
    ready = _Ready()
    pump = _Pump(follow(feed, position, stop=halt, poll_interval=poll_interval, ready=ready), ready,
                 feed._store.db)
    # The thread's life is tied to this generator's: one collected without being closed (its event
    # loop closed without ``shutdown_asyncgens()``, so its ``finally`` never runs) stops it too.
    owner = _Owner()
    release = weakref.finalize(owner, _stop_pump, inner, pump)
    try:
        while True:
            changes, ended, error = await pump.next()
            for change in changes:
                # As ``follow`` does before each change: a stop set meanwhile (by the consumer,
                # after an earlier change of this hand-over) ends the follow before this one.
                if stop is not None and stop.is_set():
                    return
                yield change
            if error is not None:
                raise error
            if ended:
                return
    finally:
        release()  # ``_stop_pump``, once
        del owner  # held until here: its collection is what stops the thread of a generator never closed
