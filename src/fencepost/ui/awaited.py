"""A store the console waits for: its database did not answer when the console started.

``open_or_await(url)`` opens the store read-only, as ``fencepost.open(url, readonly=True)`` does. An
open that fails with a transient ``OpenError`` (the server could not take a connection now: nothing
listening yet, no free slot, starting up) gives an ``AwaitedStore`` instead, which the console serves
as a store that is down; any other failure (a bad URL, a missing SQLite file, refused credentials,
a database without fencepost's tables) is raised, so the console refuses to start.

An ``AwaitedStore`` stands for the ``Store``: every attribute but ``url`` and ``close`` is the open
store's once it opened. Until then each such access raises at once the last open's ``OpenError``,
which the console reports as it reports any store that stopped answering: down, with its error code
and its URL's password hidden; and, at most once a second, it starts an open attempt on a thread of
its own. One attempt runs at a time and nobody waits for it: a database whose host swallows
traffic costs its attempt ``connect_timeout``, never a request.

The start-up checks that read a store (``check_as_they_open``: the same database given twice, a
recorded shard set given whole) cannot read one that does not answer; they run when it opens, and
a store that fails them then is refused for good: ``StoreRefused`` (code ``refused``, the check's
message as its detail) is what every access raises, and the other stores keep serving.

Closing it waits for an attempt in flight only once that attempt has a connection to the database
(a session the close must not leave behind), at most its connect timeout. An attempt still waiting
for the database to answer its first connection holds no session, and nothing of the driver can cut
that wait short: the close returns at once, and the attempt, when its connection answers or times
out, closes whatever it opened.

Only a check's own refusal is for good. An attempt that fails any other way (the open or a check's
read failing, an unexpected exception, even a ``BaseException`` such as ``KeyboardInterrupt`` or a
``CancelledError`` ending its thread) closes what it opened, and the store is tried again a second
later; an unexpected exception is logged by its type alone (its message may quote a URL).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine

from fencepost.errors import FencepostError, OpenError, waiting_may_cure

if TYPE_CHECKING:
    from fencepost._store import Store

log = logging.getLogger("fencepost.ui")

#: Seconds between two attempts to open a store that does not answer.
RETRY_S = 1.0

# The ``AwaitedStore`` whose open attempt runs on this thread: told when a connection of it opens.
_attempting = threading.local()


def _connected(_dbapi_connection: Any, _record: Any) -> None:
    """The ``connect`` event of an engine an open attempt built: the attempt on this thread, if
    any, reached its database (the store, once served, connects on other threads)."""
    store = getattr(_attempting, "store", None)
    if store is not None:
        store._reached = True


def _watch(engine: Engine) -> None:
    """Listen to the new connections of ``engine``, one an attempt's open built (inside
    ``fencepost.open``, before its first connection): only the console's own engines, never
    another pool of the process."""
    event.listen(engine, "connect", _connected)


T = TypeVar("T")
R = TypeVar("R")


class StoreRefused(OpenError):
    """A store that opened late and failed a start-up check: code ``refused``, the check's message
    (the one the start-up would have refused with) as its detail."""


def open_or_await(url: str | None) -> Store | AwaitedStore:
    """The store at ``url`` opened read-only, or an ``AwaitedStore`` when its database cannot answer now."""
    import fencepost

    try:
        return fencepost.open(url, readonly=True)
    except OpenError as exc:
        if not waiting_may_cure(exc):  # the console starts anyway only for such a failure
            raise
        return AwaitedStore(url, exc)


def awaiting(store: Any) -> bool:
    """Whether ``store`` is an ``AwaitedStore`` that has not opened yet."""
    return isinstance(store, AwaitedStore) and store.opened is None


def refusal(store: Any) -> str | None:
    """Why ``store`` was refused when it opened late (``StoreRefused``'s detail), else None."""
    return store.refused if isinstance(store, AwaitedStore) else None


def check_as_they_open(stores: Sequence[Any], read: Callable[[Any], T], check: Callable[[list[T | None]], R],
                       refuses: tuple[type[Exception], ...]) -> R:
    """``check`` over ``read`` of each store (None for one that does not answer yet), now; its result.

    Each store still awaited gets the check again when it opens, over what was read of the
    stores so far with its own reading added: a check that raises one of ``refuses`` (its
    refusal) then refuses that store (``StoreRefused``, the refusal's message as its detail). Any
    other exception leaves the store unopened, tried again later. Checks of stores opening at once
    run one at a time.
    """
    facts: list[T | None] = [None if awaiting(store) else read(store) for store in stores]
    result = check(facts)
    lock = threading.Lock()

    def when_open(i: int) -> Callable[[Store], None]:
        def recheck(opened: Store) -> None:
            got = read(opened)
            with lock:
                trial = list(facts)
                trial[i] = got
                try:
                    check(trial)
                except refuses as exc:
                    detail = str(exc) or type(exc).__name__
                    raise StoreRefused("refused", "open", detail) from None
                facts[i] = got
        return recheck

    for i, store in enumerate(stores):
        if awaiting(store):
            store.checks.append(when_open(i))
    return result


class AwaitedStore:
    """A read-only store opened once its database answers (see the module)."""

    def __init__(self, url: str | None, error: OpenError) -> None:
        from fencepost._durable import resolve_url

        self.url = resolve_url(url)
        #: Why the last attempt to open it failed (or why it was refused).
        self.error = error
        #: The start-up check's message once the store, opened late, failed it; else None.
        self.refused: str | None = None
        #: Run on the opened store before it is served (``check_as_they_open``); one raising
        #: ``StoreRefused`` refuses it, anything else counts as a failed open.
        self.checks: list[Callable[[Store], None]] = []
        self._store: Store | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._tried = time.monotonic()
        self._attempt: threading.Thread | None = None
        self._reached = False  # the attempt in flight has a connection to the database
        self._unexpected: str | None = None  # the type of the last attempt's unexpected failure

    @property
    def opened(self) -> Store | None:
        """The open store, once its database answered; else None."""
        return self._store

    def _open(self) -> Store:
        store = self._store
        if store is not None:
            return store
        with self._lock:
            if self._store is not None:
                return self._store
            if self._closed:
                raise OpenError("open_failed", "open", "the console closed this store")
            now = time.monotonic()
            if self.refused is None and self._attempt is None and now - self._tried >= RETRY_S:
                self._tried = now
                self._reached = False
                self._attempt = threading.Thread(target=self._try_open, name="fencepost-ui-open", daemon=True)
                self._attempt.start()
            raise _again(self.error)

    def _try_open(self) -> None:
        """One open attempt, on its own thread: the store served from now on, or why not.

        However the attempt ends, it is no longer in flight and what it opened is closed unless
        served: a ``BaseException`` (a ``KeyboardInterrupt``, ``SystemExit``, ``CancelledError``)
        is raised on after that, and the store is tried again as after any failed attempt.
        """
        import fencepost
        from fencepost._durable import watching_engines

        store: Store | None = None
        error: OpenError | None = None
        refused: str | None = None
        unexpected: str | None = None
        passed = False
        _attempting.store = self
        try:
            with watching_engines(_watch):
                store = fencepost.open(self.url, readonly=True)
            if not self._closed:  # else closed below, unchecked: nobody will be served it
                for check in self.checks:
                    check(store)
                passed = True
        except StoreRefused as exc:  # a check refused it: the start-up's own message
            refused = exc.detail
            error = exc
        except OpenError as exc:
            error = exc
        except FencepostError as exc:  # a check's read failed: the database went away again
            error = OpenError("open_failed", "open", exc.detail)
            error.transient = True
        except Exception as exc:  # a defect or an environment failure, not a refusal: tried again
            unexpected = type(exc).__name__
            error = OpenError("open_failed", "open", f"the open attempt failed unexpectedly ({unexpected})")
            error.transient = True
        finally:
            _attempting.store = None
            if not self._settle(store if passed else None, error, refused) and store is not None:
                store.close()  # failed, or opened after the console closed it
        # One line when a failure is new, not one a second while it lasts.
        if refused is not None or (unexpected is not None and unexpected != self._unexpected):
            from fencepost._durable import redact_url

            if refused is not None:
                log.warning("console: store %s refused once it answered: %s", redact_url(self.url), refused)
            else:
                log.warning("console: opening store %s failed unexpectedly (%s); it is tried again",
                            redact_url(self.url), unexpected)
        self._unexpected = unexpected

    def _settle(self, store: Store | None, error: OpenError | None, refused: str | None) -> bool:
        """End the attempt in flight: serve ``store`` (one that opened and passed the checks; True),
        else record why not. An attempt ended by a ``BaseException`` comes with no error: the last
        one stands."""
        with self._lock:
            self._attempt = None
            if store is not None and not self._closed:
                self._store = store
                return True
            if refused is not None:
                self.refused = refused
            if error is not None:
                self.error = error
            return False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends ask for dunders: never open for them
            raise AttributeError(name)
        return getattr(self._open(), name)

    def close(self) -> None:
        """Close the store if it opened; it is never opened after this. An attempt in flight closes
        what it opens. Once it has a connection to the database it is waited for, at most as long
        as a connection may wait for the database (its ``connect_timeout``), so that no session of
        the store outlives its close; while its first connection still waits for the database to
        answer (a host that swallows traffic), holding no session, it is not: it ends on its own
        within that timeout, closing what it opened."""
        from fencepost._durable import PG_CONNECT_TIMEOUT_S, connect_wait_s

        with self._lock:
            self._closed = True
            store, self._store = self._store, None
            attempt = self._attempt
        if attempt is not None and attempt is not threading.current_thread():
            try:
                wait = connect_wait_s(self.url)
            except ValueError:
                wait = PG_CONNECT_TIMEOUT_S
            deadline = time.monotonic() + wait
            while self._reached and time.monotonic() < deadline:
                attempt.join(0.05)
                if not attempt.is_alive():
                    break
        if store is not None:
            store.close()


def _again(exc: OpenError) -> OpenError:
    """A fresh copy of ``exc`` to raise (one exception object raised again and again would grow
    its traceback each time)."""
    err = type(exc)(exc.code, exc.method, exc.detail)
    err.__dict__.update({k: v for k, v in exc.__dict__.items() if k not in ("code", "method", "detail")})
    return err
