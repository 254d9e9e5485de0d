"""One change-feed follower per console process, broadcast to every open page as Server-Sent Events.

``FeedHub`` runs a single ``store.feed.follow`` in a background thread. Each change is read once
(``store.feed.read``) and the resulting event is handed to every subscriber's asyncio queue, so ten
open tabs cost one follower and one read per change, not ten. A second thread, the ticker, samples
the feed and journal heads once a second (for writes/s over the last minute) and, when something
moved or every few seconds, computes the shared ``stats`` event (status counts, projection lags,
health) once for everybody.

A subscriber whose queue is full (a stalled tab) is dropped with a final ``reset`` event: its page
reconnects and re-reads instead of holding the hub's memory hostage.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from fencepost.errors import FencepostError, SourceChanged

if TYPE_CHECKING:
    from fencepost._store import Store

log = logging.getLogger("fencepost.ui")

#: Events a subscriber may have waiting before it is dropped (with a ``reset``).
QUEUE_LIMIT = 1000
#: Changes a new stream replays after the position its page was rendered at; more is a ``reset``.
CATCH_UP_LIMIT = 1000
#: Seconds of head samples kept for the writes/s figure.
WINDOW_S = 60.0
#: Runs counted per second between stats: stats that counted N runs are not taken again before
#: N / STATS_RUNS_PER_S seconds have passed, even when something moved. Counting runs by status reads
#: the whole run table (about 40 ms at 400,000 runs on PostgreSQL, 15 ms on SQLite): a console over
#: a large store must not keep its database busy with it every second. Paced by the count, not by
#: the time the stats took, so that a busy machine does not slow a small store's pages.
STATS_RUNS_PER_S = 400_000
_encoder = msgspec.json.Encoder()


def sse(event: str, data: Any, event_id: str | None = None) -> bytes:
    """One Server-Sent Event frame: ``event:``, optional ``id:``, and one ``data:`` line of JSON."""
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return head.encode() + b"data: " + _line_safe(_encoder.encode(data)) + b"\n\n"


#: Characters JSON may hold raw that a client splitting lines as ``str.splitlines`` does (httpx's
#: ``iter_lines``, the SSE clients built on it) takes for a line end: NEL and the Unicode line and
#: paragraph separators. They only occur inside a JSON string, where their escape means the same.
_LINE_ENDS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def _line_safe(body: bytes) -> bytes:
    for raw, escaped in _LINE_ENDS:
        if raw in body:
            body = body.replace(raw, escaped)
    return body


#: What a queued ``run`` frame changed: ``(store name, revision)`` ("" over one store), else None.
Key = tuple[str, int] | None


class Subscriber:
    """One open event stream: an asyncio queue filled from the hub's threads.

    Each item is a frame and its ``Key``, so that a stream which first replayed the changes up to
    some revision can skip the live frames it already sent.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # Unbounded as a queue (put never fails); ``_offer`` enforces the limit.
        self.queue: asyncio.Queue[tuple[bytes, Key] | None] = asyncio.Queue()
        self.dropped = False

    def _offer(self, frame: bytes | None, key: Key = None) -> None:  # runs on the subscriber's loop
        if self.dropped:
            return
        if frame is None or self.queue.qsize() >= QUEUE_LIMIT:
            self.dropped = True
            if frame is not None:
                self.queue.put_nowait((sse("reset", {"reason": "slow_consumer"}), None))
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait((frame, key))


class Rate(msgspec.Struct, frozen=True):
    """A counter's rate over the sampled window: ``per_s`` over ``window_s`` seconds."""

    per_s: float
    window_s: float


class FeedHub:
    """The console's only change-feed follower, shared by every subscriber.

    ``stats`` is a function of the store returning a JSON-encodable value; it is called on the
    ticker thread and its result broadcast as the ``stats`` event.
    """

    def __init__(self, store: Store, *, stats: Callable[[FeedHub], Any] | None = None, poll_interval: float = 2.0,
                 tick: float = 1.0, stats_every: float = 5.0) -> None:
        self.store = store
        self._stats_fn = stats
        self._poll_interval = poll_interval
        self._tick = tick
        self._stats_every = stats_every
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._subscribers: set[Subscriber] = set()
        self._threads: list[threading.Thread] = []
        self._dirty = threading.Event()
        self._urgent = threading.Event()  # stats at the next tick, whatever they cost (see _stats_now)
        self._samples: collections.deque[tuple[float, str, int, int]] = collections.deque()
        self.followers_started = 0  # how many follow() iterators this hub opened (tests assert one)
        self.position: Any = None
        self.last_stats: Any = None
        #: Why each follower last stopped (``""``: the one store's), None while it follows.
        self.errors: dict[str, str | None] = {"": None}
        #: The error code while the store cannot answer the stats (the database went away), else None.
        self.unavailable: str | None = None
        self._logged: dict[str, tuple[str, float]] = {}  # per follower: the code last logged, and when

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the follower and the ticker (idempotent)."""
        if self._threads:
            return
        try:
            self.position = self.store.feed.position()
        except FencepostError as exc:
            # Its database does not answer (yet): the console serves it as down; the follower
            # reads the position once it answers.
            log.warning("console: the store does not answer (%s); waiting for it", exc.code)
            self.unavailable = exc.code
        self._sample()
        for target, name in ((self._follow, "fencepost-ui-follow"), (self._ticker, "fencepost-ui-tick")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        """Stop both threads and end every subscriber's stream."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        with self._lock:
            subs = list(self._subscribers)
            self._subscribers.clear()
        for sub in subs:
            self._deliver(sub, None)

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------------ subscribers
    def subscribe(self) -> Subscriber:
        """A new subscriber on the running event loop."""
        sub = Subscriber(asyncio.get_running_loop())
        with self._lock:
            self._subscribers.add(sub)
        if self.closed:
            self._deliver(sub, None)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._lock:
            self._subscribers.discard(sub)

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def publish(self, event: str, data: Any, event_id: str | None = None, key: Key = None) -> None:
        """Encode once, hand the frame (and its ``key``) to every subscriber's loop."""
        frame = sse(event, data, event_id)
        with self._lock:
            subs = list(self._subscribers)
        for sub in subs:
            self._deliver(sub, frame, key)

    def _deliver(self, sub: Subscriber, frame: bytes | None, key: Key = None) -> None:
        try:
            sub.loop.call_soon_threadsafe(sub._offer, frame, key)
        except RuntimeError:  # its loop is closed: the page is gone
            self.unsubscribe(sub)

    # ------------------------------------------------------------------ follower
    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                self.followers_started += 1
                feed = self.store.feed
                if self.position is None:  # the store did not answer at start-up: follow from now on
                    self.position = feed.position()
                self._reads_again(feed, self.position)
                for change in feed.follow(self.position, stop=self._stop, poll_interval=self._poll_interval):
                    data = run_event(feed, change)
                    self.position = change.position
                    self._follower_back()
                    self.publish("run", data, str(change.revision), ("", change.revision))
                    self._dirty.set()
            except SourceChanged:
                self._guarded(self._source_changed)
            except Exception as exc:  # never let the follower die silently
                self._follower_failed(exc)

    def _source_changed(self) -> None:
        # A rotation or a restored copy: positions of the old source mean nothing now.
        self.position = self.store.feed.position()
        with self._lock:
            self._samples.clear()
        self.publish("reset", {"reason": "source_changed"})

    def _guarded(self, step: Callable[[], None], name: str = "") -> None:
        """Run ``step`` of the follower's recovery; its failure counts as the follower's own.

        A SQLite file moved away reads as a replaced file (``SourceChanged``), and the new position
        cannot be read either until the file is back: the follower must wait and retry, not die.
        """
        try:
            step()
        except Exception as exc:
            self._follower_failed(exc, name)

    @property
    def error(self) -> str | None:
        """Why the follower last stopped, None while it follows (over one store)."""
        return self.errors.get("")

    def _reads_again(self, feed: Any, position: Any, name: str = "") -> None:
        """After the follower (of store ``name`` over several) failed: read the feed once from its
        position before following again, and once that answers, its error is over.

        A change arriving would say so too, but on a quiet store none comes: the error would stay
        in ``/health.json`` for as long as no run changes. A failure of this read is the
        follower's own (``SourceChanged``: the source is read again, then this again).
        """
        if self.errors.get(name) is None:
            return
        feed.changes_since(position, 1)
        self._follower_back(name)

    def _follower_back(self, name: str = "") -> None:
        self.errors[name] = None
        self._logged.pop(name, None)

    def _follower_failed(self, exc: Exception, name: str = "") -> None:
        """Note why the follower (of store ``name`` over several) stopped and wait a second before
        it follows again.

        Logged once per error code (and at most once a minute while it lasts), not on every retry:
        a database that is gone for an hour is one line, not 3600.
        """
        code = exc.code if isinstance(exc, FencepostError) else type(exc).__name__
        now = time.monotonic()
        logged = self._logged.get(name)
        if logged is None or code != logged[0] or now - logged[1] >= 60.0:
            log.warning("console feed follower%s: %s; retrying", f" of store {name}" if name else "", code)
            self._logged[name] = (code, now)
        # Have the statistics taken again at the next tick: their failure is what tells the pages
        # the database is unavailable, and they are otherwise due only every few seconds. (At once,
        # however costly, only when the follower newly fails: it retries every second, and costly
        # stats of every store every second while one is down are what STATS_RUNS_PER_S prevents.)
        if self.errors.get(name) != code:
            self._stats_now()
        else:
            self._dirty.set()
        self.errors[name] = code
        self._stop.wait(1.0)

    # ------------------------------------------------------------------ ticker
    def _sample(self) -> None:
        from fencepost.journal import head

        try:
            pos = self.store.feed.position()
            h = head(self.store)
        except FencepostError:
            self._stats_now()  # statistics at once: their failure tells the pages (an idle follower may not notice)
            return
        now = time.monotonic()
        with self._lock:
            self._samples.append((now, pos.source, pos.revision, h.position if h else 0))
            while self._samples and self._samples[0][0] < now - WINDOW_S:
                self._samples.popleft()

    def rates(self) -> tuple[Rate, Rate]:
        """Run-row writes/s (change-feed revisions) and journal appends/s over the last minute."""
        with self._lock:
            samples = list(self._samples)
        return _rates(samples)

    def _stats_taken(self, stats: Any) -> None:
        """Run on the ticker thread after each stats taken, before they are sent (a hook)."""

    def _stats_now(self) -> None:
        """Have the stats taken at the next tick, however recently costly ones were: a store stopped
        or started answering, which the pages learn from the stats (within about a second)."""
        self._dirty.set()
        self._urgent.set()

    def _ticker(self) -> None:
        last_stats = 0.0
        earliest = 0.0  # no stats before then (STATS_RUNS_PER_S)
        while not self._stop.wait(self._tick):
            self._sample()
            now = time.monotonic()
            if self._stats_fn is None or (now < earliest and not self._urgent.is_set()) or not (
                    self._dirty.is_set() or now - last_stats >= self._stats_every):
                continue
            self._dirty.clear()
            self._urgent.clear()
            last_stats = now
            try:
                self.last_stats = self._stats_fn(self)
                earliest = now + _runs_counted(self.last_stats) / STATS_RUNS_PER_S
            except Exception as exc:
                code = exc.code if isinstance(exc, FencepostError) else type(exc).__name__
                if self.unavailable is None:  # once per outage, to the log and to every page
                    log.warning("console stats failed (%s)", code)
                    self.unavailable = code
                    self.publish("unavailable", {"error": code})
                last_stats = earliest = 0.0  # try again next tick: pages learn within a second that it is back
                continue
            self.unavailable = None
            self._stats_taken(self.last_stats)
            self.publish("stats", self.last_stats)


def _runs_counted(stats: Any) -> int:
    """How many runs the stats counted (their ``counts``, summed over the stores), 0 if none."""
    counts = stats.get("counts") if isinstance(stats, dict) else None
    return sum(n for n in counts.values() if isinstance(n, int)) if isinstance(counts, dict) else 0


def _owner_text(owner: Any) -> str | None:
    if owner is None:
        return None
    return f"{owner.host_id}/{owner.pid}/{owner.nonce[:8]}"


def run_event(feed: Any, change: Any) -> dict[str, Any]:
    """The ``run`` event of one change: the run's snapshot read once, without its state."""
    return snapshot_event(change, feed.read([change.run_id]).snapshots[0])


def snapshot_event(change: Any, snap: Any) -> dict[str, Any]:
    """The ``run`` event of one change and a snapshot of its run: status, owner, times, cancellation
    flag; the flow name, which comes from the state, redacted as the pages show it."""
    from fencepost.changefeed import Missing
    from fencepost.ui.views import flow_text

    if isinstance(snap, Missing):
        return {"run_id": change.run_id, "revision": change.revision, "deleted": True}
    return {
        "run_id": snap.run_id, "revision": change.revision, "deleted": False,
        "status": snap.status, "flow_name": flow_text(snap.flow_name),
        "owner": _owner_text(snap.owner), "created_at_ms": snap.created_at_ms,
        "started_at_ms": snap.started_at_ms, "finished_at_ms": snap.finished_at_ms,
        "cancel_requested": snap.cancellation is not None,
    }


def catch_up(feed: Any, since: Any) -> tuple[list[dict[str, Any]], Any] | None:
    """The ``run`` events of the changes after ``since`` (a page's position), and the position they
    reach, read in one snapshot; None when there are more than ``CATCH_UP_LIMIT`` of them.

    Raises ``SourceChanged`` when ``since`` is of another source (or ahead of this one).
    """
    from fencepost.changefeed import Position

    page = feed.changes_with_snapshots(since, CATCH_UP_LIMIT)
    if page.has_more:
        return None
    events = [snapshot_event(c, s) for c, s in zip(page.changes, page.snapshots, strict=True)]
    return events, Position(page.source, page.revision)


def _rates(samples: list[tuple[float, str, int, int]]) -> tuple[Rate, Rate]:
    if len(samples) < 2:
        return Rate(0.0, 0.0), Rate(0.0, 0.0)
    first, last = samples[0], samples[-1]
    if first[1] != last[1]:  # the source rotated inside the window
        first = next(s for s in samples if s[1] == last[1])
    span = last[0] - first[0]
    if span <= 0:
        return Rate(0.0, 0.0), Rate(0.0, 0.0)
    return (Rate(round((last[2] - first[2]) / span, 2), round(span, 1)),
            Rate(round((last[3] - first[3]) / span, 2), round(span, 1)))


class MultiFeedHub(FeedHub):
    """The shared follower of a console over several named stores: one follower thread per store.

    Each store's feed is followed on a thread of its own, so every open page still costs one
    follower per store, not one per tab, and a store that stops answering stops only its own
    follower: it retries on its own while the others go on. Each ``run`` event carries ``store``,
    the name of the store it came from; revisions of two stores are never compared.
    ``positions`` holds each store's last position; ``rates_of(name)`` is one store's writes/s;
    ``down`` maps each store that does not answer now to its error code. A rotated source resets
    that store's position and sends ``reset``.
    """

    def __init__(self, stores: Mapping[str, Store], *, stats: Callable[[FeedHub], Any] | None = None,
                 poll_interval: float = 2.0, tick: float = 1.0, stats_every: float = 5.0) -> None:
        first = next(iter(stores.values()))
        super().__init__(first, stats=stats, poll_interval=poll_interval, tick=tick, stats_every=stats_every)
        self.stores = dict(stores)
        self.positions: dict[str, Any] = {}
        #: The stores that do not answer now (the last stats or the follower said so): name -> error code.
        self.down: dict[str, str] = {}
        #: When each store last answered the ticker's sample (``time.monotonic()``).
        self.answered_at: dict[str, float] = {}
        self.errors = dict.fromkeys(self.stores)
        self._store_samples: dict[str, collections.deque[tuple[float, str, int, int]]] = {
            name: collections.deque() for name in self.stores}

    def start(self) -> None:
        """Start a follower per store and the ticker (idempotent)."""
        if self._threads:
            return
        for name, store in self.stores.items():
            try:
                self.positions[name] = store.feed.position()
            except FencepostError as exc:
                # Down at start-up as later: served as down until it answers the ticker's sample.
                log.warning("console: store %s does not answer (%s); waiting for it", name, exc.code)
                self.positions[name] = None
                self.down[name] = exc.code
        self._sample()
        targets = [(lambda n=name: self._follow_one(n), f"fencepost-follow-{name}") for name in self.stores]
        for target, name in (*targets, (self._ticker, "fencepost-ui-tick")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _follow_one(self, name: str) -> None:
        while not self._stop.is_set():
            try:
                self.followers_started += 1
                feed = self.stores[name].feed
                if self.positions[name] is None:  # it did not answer at start-up: follow from now on
                    self.positions[name] = feed.position()
                self._reads_again(feed, self.positions[name], name)
                for change in feed.follow(self.positions[name], stop=self._stop, poll_interval=self._poll_interval):
                    data = {"store": name, **run_event(feed, change)}
                    self.positions[name] = change.position
                    self._follower_back(name)
                    self.publish("run", data, f"{name}:{change.revision}", (name, change.revision))
                    self._dirty.set()
            except SourceChanged:
                self._guarded(lambda: self._source_changed_of(name), name)
            except Exception as exc:  # never let a follower die silently
                self._follower_failed(exc, name)

    def _source_changed_of(self, name: str) -> None:
        # A rotation or a restored copy of this store: positions of its old source mean nothing now.
        self.positions[name] = self.stores[name].feed.position()
        with self._lock:
            self._store_samples[name].clear()
        self.publish("reset", {"reason": "source_changed"})

    def _stats_taken(self, stats: Any) -> None:
        """Note which stores the stats found down; a store newly down is logged and sent to every
        page once (``unavailable`` naming the store), a store back is in the stats themselves."""
        parts = stats.get("stores", {}) if isinstance(stats, dict) else {}
        down = {name: part["error"] for name, part in parts.items() if "error" in part}
        for name, code in down.items():
            if name not in self.down:
                log.warning("console: store %s does not answer (%s)", name, code)
                self.publish("unavailable", {"store": name, "error": code})
        self.down = down

    def _sample(self) -> None:
        from fencepost.journal import head

        for name, store in self.stores.items():
            try:
                pos = store.feed.position()
                h = head(store)
            except FencepostError:
                if name not in self.down:  # as for one store: statistics at once
                    self._stats_now()
                continue
            now = time.monotonic()
            self.answered_at[name] = now
            if name in self.down:  # it answers again: read by the statistics (at once) and the pages
                self.down = {n: code for n, code in self.down.items() if n != name}
                self._stats_now()
            with self._lock:
                samples = self._store_samples[name]
                samples.append((now, pos.source, pos.revision, h.position if h else 0))
                while samples and samples[0][0] < now - WINDOW_S:
                    samples.popleft()

    def rates_of(self, name: str) -> tuple[Rate, Rate]:
        """One store's run-row writes/s and journal appends/s over the last minute."""
        with self._lock:
            samples = list(self._store_samples[name])
        return _rates(samples)

    def rates(self) -> tuple[Rate, Rate]:
        """Every store's writes/s and appends/s, summed (the window is the shortest of theirs)."""
        per = [self.rates_of(name) for name in self.stores]
        window = min((r.window_s for r, _ in per), default=0.0)
        return (Rate(round(sum(r.per_s for r, _ in per), 2), window),
                Rate(round(sum(j.per_s for _, j in per), 2), window))
