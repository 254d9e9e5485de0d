"""A store the console waits for: its database did not answer when the console started.

``open_or_await(url)`` opens the store read-only, as ``fencepost.open(url, readonly=True)`` does. An
open that fails with a transient ``OpenError`` (the server could not take a connection now: nothing
listening yet, no free slot, starting up) gives an ``AwaitedStore`` instead, which the console serves
as a store that is down; any other failure (a bad URL, a missing SQLite file, refused credentials,
a database without fencepost's tables) is raised, so the console refuses to start.

An ``AwaitedStore`` stands for the ``Store``: every attribute but ``url`` and ``close`` opens the
store first (at most one attempt a second) and then is the open store's. Until the database answers,
each such access raises the last open's ``OpenError``, which the console reports as it reports any
store that stopped answering: down, with its error code and its URL's password hidden.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from fencepost.errors import OpenError

if TYPE_CHECKING:
    from fencepost._store import Store

#: Seconds between two attempts to open a store that does not answer.
RETRY_S = 1.0


def waits(exc: BaseException) -> bool:
    """Whether the console starts anyway when opening a store failed with ``exc``: only a transient
    ``OpenError``, one that the same open may not meet when retried."""
    return isinstance(exc, OpenError) and exc.transient is True


def open_or_await(url: str | None) -> Store | AwaitedStore:
    """The store at ``url`` opened read-only, or an ``AwaitedStore`` when its database cannot answer now."""
    import fencepost

    try:
        return fencepost.open(url, readonly=True)
    except OpenError as exc:
        if not waits(exc):
            raise
        return AwaitedStore(url, exc)


def awaiting(store: Any) -> bool:
    """Whether ``store`` is an ``AwaitedStore`` that has not opened yet."""
    return isinstance(store, AwaitedStore) and store.opened is None


class AwaitedStore:
    """A read-only store opened once its database answers (see the module)."""

    def __init__(self, url: str | None, error: OpenError) -> None:
        from fencepost._durable import resolve_url

        self.url = resolve_url(url)
        #: Why the last attempt to open it failed.
        self.error = error
        self._store: Store | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._tried = time.monotonic()

    @property
    def opened(self) -> Store | None:
        """The open store, once its database answered; else None."""
        return self._store

    def _open(self) -> Store:
        store = self._store
        if store is not None:
            return store
        import fencepost

        with self._lock:
            if self._store is not None:
                return self._store
            if self._closed:
                raise OpenError("open_failed", "open", "the console closed this store")
            now = time.monotonic()
            if now - self._tried >= RETRY_S:
                self._tried = now
                try:
                    self._store = fencepost.open(self.url, readonly=True)
                    return self._store
                except OpenError as exc:
                    self.error = exc
            raise _again(self.error)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends ask for dunders: never open for them
            raise AttributeError(name)
        return getattr(self._open(), name)

    def close(self) -> None:
        """Close the store if it opened; it is never opened after this."""
        with self._lock:
            self._closed = True
            store, self._store = self._store, None
        if store is not None:
            store.close()


def _again(exc: OpenError) -> OpenError:
    """A fresh copy of ``exc`` to raise (one exception object raised again and again would grow
    its traceback each time)."""
    err = OpenError(exc.code, exc.method, exc.detail)
    err.__dict__.update({k: v for k, v in exc.__dict__.items() if k not in ("code", "method", "detail")})
    return err
