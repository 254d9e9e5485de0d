"""Opening a store: one database, one clock, one consensus shared by every part."""

from __future__ import annotations

from typing import Any

from fencepost._durable import Database
from fencepost._migrations import migrate, pending
from fencepost.changefeed.feed import ChangeFeed
from fencepost.clock import Clock, SystemClock
from fencepost.errors import PersistenceError
from fencepost.journal.consensus import Consensus, SqlConsensus
from fencepost.journal.journal import Journal
from fencepost.runstore.attempts import AttemptStore
from fencepost.runstore.store import RunStore


class Store:
    """A fencepost database: ``runs``, ``attempts``, ``journal``, ``feed`` and the ``clock``."""

    def __init__(self, db: Database, *, clock: Clock | None = None, attempt_policy: Any = None,
                 consensus: Consensus | None = None) -> None:
        self.db = db
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.consensus: Consensus = consensus if consensus is not None else SqlConsensus()
        self.journal = Journal(self)
        self.runs = RunStore(self)
        self.attempts = AttemptStore(self, attempt_policy)
        self.feed = ChangeFeed(self)

    @property
    def url(self) -> str:
        return self.db.url

    def close(self) -> None:
        """Release every pooled connection."""
        self.db.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open(url: str | None = None, *, clock: Clock | None = None, attempt_policy: Any = None,
         consensus: Consensus | None = None, readonly: bool = False, group_commit: bool = True) -> Store:
    """Open (creating and migrating if needed) the store at ``url``.

    ``url=None`` means ``$FENCEPOST_DB``, else ``sqlite:///.flows/flows.db``. Migrations run once,
    in one pass, under the writer lock, so several processes may open one fresh database at once.
    ``readonly=True`` never creates or migrates: a missing or unmigrated database is an error.
    ``group_commit`` (on by default) lets concurrent write calls of this process (threads, or
    asyncio tasks through threads) share one durable COMMIT, each call in its own savepoint with
    its own outcome; ``group_commit=False`` gives every call its own transaction.
    """
    db = Database(url, readonly=readonly, group_commit=group_commit)
    try:
        if readonly:
            try:
                missing = pending(db)
            except Exception:
                raise PersistenceError("persistence_failed", "open", "database is not a fencepost store") from None
            if missing:
                raise PersistenceError(
                    "persistence_failed", "open", "database needs migrations (open it writable once)"
                )
        else:
            migrate(db)
        return Store(db, clock=clock, attempt_policy=attempt_policy, consensus=consensus)
    except BaseException:
        db.dispose()
        raise
