"""Opening a store: one database, one clock, one consensus shared by every part."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from fencepost._durable import ENV_SOURCE, Database, DbFailure, from_environment
from fencepost._migrations import (
    READS_AROUND,
    STORE_NAMESPACES,
    _applied,
    check_ledger,
    damage,
    damage_error,
    discover,
    migrate,
    pending_detail,
    permission_note,
    read_state,
)
from fencepost.changefeed.feed import ChangeFeed
from fencepost.clock import Clock, SystemClock
from fencepost.errors import DatabaseMissing, OpenError
from fencepost.journal.consensus import Consensus, SqlConsensus
from fencepost.journal.journal import Journal
from fencepost.runstore.attempts import AttemptStore, validate_policy
from fencepost.runstore.store import RunStore


class _Probed(Exception):
    """Ends the write probe's transaction: the writer rolls it back."""


def _write_probe(conn: Connection, db: Database) -> None:
    """Check that the schema holds what its ledger says was applied (``damage``), then write one
    ledger row and roll the whole transaction back: nothing reaches the disk or the log (a
    savepoint rolled back would still leave its pages to be written at COMMIT)."""
    missing = damage(conn, db, _applied(conn, db))
    if missing:
        raise damage_error(db, missing)
    conn.exec_driver_sql("INSERT INTO flows_migrations (migration_id, name) VALUES (-1, 'write-probe')")
    raise _Probed


_CLOCK_METHODS = ("now_ms",)
_CONSENSUS_METHODS = ("guard", "claim", "activate", "heartbeat", "reconfirm", "release", "steal", "recover")


def _check_options(url: object, clock: object, attempt_policy: object, consensus: object, readonly: object,
                   group_commit: object) -> None:
    """Refuse a wrong argument of ``open`` before anything is created; messages name the argument
    and the type given, never its value."""
    if url is not None and not isinstance(url, str):
        raise ValueError(f"fencepost.open: url must be a str or None, not {type(url).__name__}")
    if isinstance(url, str) and not url.strip():
        raise ValueError("fencepost.open: url is empty; give None for $FENCEPOST_DB or the default store")
    for name, value in (("readonly", readonly), ("group_commit", group_commit)):
        if type(value) is not bool:
            raise ValueError(f"fencepost.open: {name} must be True or False, not {type(value).__name__}")
    check_parts(clock, consensus, "fencepost.open")
    validate_policy(attempt_policy)


def check_parts(clock: object, consensus: object, where: str) -> None:
    """Refuse a ``clock`` without ``now_ms`` or a ``consensus`` that is not a strategy, naming the
    argument and the type given (never its value); ``where`` names the call (``fencepost.open``)."""
    for name, value, methods in (("clock", clock, _CLOCK_METHODS), ("consensus", consensus, _CONSENSUS_METHODS)):
        if value is not None and not all(callable(getattr(value, m, None)) for m in methods):
            raise ValueError(f"{where}: {name} must be None or an object with {', '.join(methods)} "
                            f"methods, not {type(value).__name__}")


def _name_the_environment(err: OpenError) -> None:
    """Say in ``err`` that the URL it names came from ``$FENCEPOST_DB`` (no URL was given)."""
    err.detail = f"{err.detail} (the URL from {ENV_SOURCE})"
    err.args = (f"{err.code}: {err.component}.{err.method}: {err.detail}",)


def _noted(err: OpenError, note: str) -> OpenError:
    """``err`` with ``note`` added to its message."""
    noted = OpenError(err.code, err.method, f"{err.detail}; {note}", db_code=err.db_code)
    noted.transient = getattr(err, "transient", False)
    return noted


class Store:
    """A fencepost database: ``runs``, ``attempts``, ``journal``, ``feed`` and the ``clock``.

    ``migrations_applied`` holds the ids of the migrations ``open`` applied (empty when the
    database was already current, or opened read-only).
    """

    def __init__(self, db: Database, *, clock: Clock | None = None, attempt_policy: Any = None,
                 consensus: Consensus | None = None) -> None:
        self.db = db
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.consensus: Consensus = consensus if consensus is not None else SqlConsensus()
        self.journal = Journal(self)
        self.runs = RunStore(self)
        self.attempts = AttemptStore(self, attempt_policy)
        self.feed = ChangeFeed(self)
        self.migrations_applied: tuple[int, ...] = ()

    @property
    def url(self) -> str:
        return self.db.url

    def close(self) -> None:
        """Release every pooled connection. A closed store refuses every later call (its error
        says the store is closed); closing it again does nothing."""
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _readable(db: Database) -> None:
    """Refuse (``OpenError``) a database a read-only open cannot read as a store."""
    db.probe()
    # The ledger is read once: a migration another process commits meanwhile is for the next open.
    ledger, missing = db.read(lambda conn: read_state(conn, db))
    check_ledger(db, ledger)
    todo = [m for m in discover(db.backend.migration_suffix, STORE_NAMESPACES) if m.id not in ledger]
    if any(m.id not in READS_AROUND for m in todo):
        # A PostgreSQL schema that is not there (it reads as unmigrated) is no store, as a
        # SQLite file that is not there (refused by ``Database``): not a store that needs
        # migrating. Looked up only here: a store that is there costs no round trip for it.
        gone = db.missing_namespace()
        if gone is not None:
            raise DatabaseMissing("database_missing", "open",
                                  f"{gone}; create it with `fencepost init`")
        raise OpenError("needs_migrations", "open", pending_detail(db, todo))
    if missing:
        raise damage_error(db, missing)


def open(url: str | None = None, *, clock: Clock | None = None, attempt_policy: Any = None,
         consensus: Consensus | None = None, readonly: bool = False, group_commit: bool = True) -> Store:
    """Open (creating and migrating if needed) the store at ``url``.

    ``url=None`` means ``$FENCEPOST_DB``, else ``sqlite:///.flows/flows.db``. Migrations run once,
    in one pass, under the writer lock, so several processes may open one fresh database at once.
    ``readonly=True`` never creates or migrates: a missing or unmigrated database is an error (a store
    missing only migrations 4002, 4003 and 4004, the mark of a shard set's finished founding and the
    bounds of a shard's membership record, opens as it is).

    Every failure is an ``OpenError`` whose ``code`` says why (``not_a_database``, ``corrupt``,
    ``cannot_connect``, ``database_missing``, ``auth_failed``, ``permission_denied``,
    ``needs_migrations``, ``schema_too_new``, ``schema_mismatch``, ``migration_blocked``, ``disk_full``,
    ``open_failed``) and whose message names the path or the URL with its password masked.
    ``schema_mismatch`` also refuses a store that lacks a column of its tables or a trigger that
    maintains it (revisions, tombstones, lease release, notifications) its ledger says was created
    (dropped, renamed or disabled by hand), naming them; ``fencepost migrations status`` lists them.
    ``permission_denied`` of a writable open that met pending migrations names them. A bad URL
    is a ``ValueError``. With no ``url`` given, both say the URL came from ``$FENCEPOST_DB``. A
    pending migration never waits without limit for another session's lock: it gives up with
    ``migration_blocked`` (transient), nothing applied (see ``docs/concepts/backends.md``).

    ``group_commit`` (on by default) lets concurrent write calls of this process (threads, or
    asyncio tasks through threads) share one durable COMMIT, each call in its own savepoint with
    its own outcome; ``group_commit=False`` gives every call its own transaction.
    Wrong arguments (a ``clock`` without ``now_ms``, ``readonly="yes"``, an invalid
    ``attempt_policy``, an empty ``url``) are refused before anything is created.
    """
    _check_options(url, clock, attempt_policy, consensus, readonly, group_commit)
    try:
        return _open(url, clock, attempt_policy, consensus, readonly, group_commit)
    except OpenError as exc:
        if from_environment(url):
            _name_the_environment(exc)  # no URL was given: say where the one named came from
        raise


def _open(url: str | None, clock: Clock | None, attempt_policy: Any, consensus: Consensus | None, readonly: bool,
          group_commit: bool) -> Store:
    db = Database(url, readonly=readonly, group_commit=group_commit)
    try:
        failure: OpenError | None = None
        done: list[int] = []
        try:
            if readonly:
                # A refused read-only open leaves a SQLite file as it was (see ``Database.vetted``).
                db.vetted(lambda: _readable(db), confirm=True)
            else:
                db.probe()
                done = migrate(db)
                if not done:
                    # Nothing to migrate, so nothing has written yet: prove this open may write. A
                    # read-only SQLite file opens silently read-only (even BEGIN IMMEDIATE succeeds) and
                    # would fail only at the first write; a PostgreSQL role may lack INSERT.
                    try:
                        db.write(lambda conn: _write_probe(conn, db))
                    except _Probed:
                        pass
                else:
                    missing = db.read(lambda conn: damage(conn, db, _applied(conn, db)))
                    if missing:
                        raise damage_error(db, missing)
        except DbFailure as exc:
            failure = db.open_error(exc)
            if failure.code == "permission_denied" and not readonly:
                # A role that may not change the schema met pending migrations: say which.
                note = permission_note(db)
                if note is not None:
                    failure = _noted(failure, note)
        if failure is not None:
            raise failure
        store = Store(db, clock=clock, attempt_policy=attempt_policy, consensus=consensus)
        store.migrations_applied = tuple(done)
        return store
    except BaseException:
        db.dispose()
        raise
