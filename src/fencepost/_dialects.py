"""The only module that tells SQLite from PostgreSQL.

Each backend class answers the same questions: how to configure a fresh engine, how a write
transaction begins (SQLite ``BEGIN IMMEDIATE``; PostgreSQL a per-schema advisory lock taken first),
how a read snapshot begins, which driver errors are transient, how to build an upsert (and a
page of them at once), where the store's tables live. Below the classes sit the two constructs that
module-level statements, compiled once per dialect, render differently: ``greatest`` and
``in_json_ids``.
"""

from __future__ import annotations

import getpass
import os
import random
import re
import socket
import sqlite3
import struct
import time
import traceback
import weakref
from collections.abc import Callable, Collection, Mapping
from typing import Any
from urllib.parse import quote

import msgspec
from sqlalchemy import Table, Text, bindparam, case, cast, event, func, literal, text
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.dialects.postgresql import psycopg as _pg_psycopg
from sqlalchemy.dialects.sqlite import pysqlite as _sqlite_pysqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement
from sqlalchemy.types import NullType

from fencepost._checkpoint import WRITER_BACKSTOP_PAGES, Checkpointer
from fencepost._statements import Sql, run

SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def schema_problem(name: str) -> str | None:
    """Why ``name`` cannot be a store's PostgreSQL schema (the ``schema`` URL option), else None.

    The server's own schemas are refused: ``information_schema`` (a store there would put its
    tables among the catalog views) and every ``pg_`` name (``pg_catalog``, ``pg_toast``,
    ``pg_temp``, ``pg_temp_N``: the server reserves the prefix and fails such an open without a reason).
    """
    if not SCHEMA_NAME.match(name):
        return "schema must match [a-z_][a-z0-9_]{0,62}"
    if name == "information_schema" or name.startswith("pg_"):
        return ("schema names a PostgreSQL system schema (information_schema, pg_*): "
                "give a schema of your own (?schema=NAME)")
    return None

# Transient on SQLite: the writer lock was busy (a peer holds it) or the snapshot went stale.
_SQLITE_TRANSIENT = {
    "SQLITE_BUSY",
    "SQLITE_BUSY_SNAPSHOT",
    "SQLITE_BUSY_RECOVERY",
    "SQLITE_BUSY_TIMEOUT",
    "SQLITE_LOCKED",
    "SQLITE_LOCKED_SHAREDCACHE",
}
# Transient on PostgreSQL: serialization failure, deadlock, and the connection/operator classes.
_PG_TRANSIENT_CODES = {"40001", "40P01", "55P03", "57P01", "57P02", "57P03", "57P05", "25P03"}
_PG_TRANSIENT_CLASSES = {"08"}
# The server ended the session (terminated, shutting down, not yet accepting, idle past the role's
# idle_session_timeout or in a transaction past its idle_in_transaction_session_timeout): the
# connection is gone. 57P05 comes at the first use of a kept connection that sat idle outside any
# transaction (before any statement of the call ran); 25P03 rolled its transaction back.
_PG_LOST_CODES = {"57P01", "57P02", "57P03", "57P05", "25P03"}
# The session ended with its transaction rolled back by the server: a COMMIT that fails with it did
# not commit (its outcome is known), unlike one that lost its connection any other way.
_PG_ENDED_UNCOMMITTED = "25P03"
# Why the server ended a session, said instead of "the connection was lost" (the role's setting).
_PG_SESSION_ENDED = {
    "57P05": "the server ended the session after it sat idle past idle_session_timeout",
    "25P03": "the server ended the session after its transaction sat idle past "
             "idle_in_transaction_session_timeout (the transaction was rolled back)",
}

# What a failure's code means, added to its message (value-free: a rule or a setting, never SQL or
# values). SQLite: by ``sqlite_errorname`` prefix. PostgreSQL: by SQLSTATE, else by its class.
_WRITE_LOCK_HELD = "another connection held the write lock"
_SQLITE_REASONS = {
    "SQLITE_BUSY": f"{_WRITE_LOCK_HELD} past the busy timeout (busy_timeout_ms)",
    "SQLITE_LOCKED": f"{_WRITE_LOCK_HELD} on every retry",
    "SQLITE_FULL": "the disk is full",
    "SQLITE_READONLY": "the database file or its directory is read-only",
    # The log's shared-memory index (-shm) could not grow: SQLite's own word is "usually a full disk".
    "SQLITE_IOERR_SHMSIZE": "the disk is full (the log's shared-memory index could not grow)",
    "SQLITE_IOERR": "disk I/O error",
    "SQLITE_CORRUPT": "the database file is corrupt",
    "SQLITE_NOTADB": "the file is not a SQLite database",
    "SQLITE_CANTOPEN": "the database file or its log cannot be opened",
    "SQLITE_PERM": "permission denied",
    "SQLITE_AUTH": "permission denied",
}
# A schema object fencepost's statements name is not there: dropped by hand, or a database another
# tool changed. Fencepost's own names only, never a value. Said of the tables migrations create: a
# projection builder says its own tables' absence in its own words (``ProjectionBuilder``).
MISSING_OBJECT = ("a table or column fencepost needs is missing (dropped or altered by hand?); "
                   "fencepost migrations status shows what the database records")
_PG_REASONS = {
    "42P01": MISSING_OBJECT,
    "42703": MISSING_OBJECT,
    "55P03": f"{_WRITE_LOCK_HELD} (or a row lock) past the wait (busy_timeout_ms, or the session's lock_timeout)",
    "57014": "a statement was cancelled (statement_timeout, or a cancel request)",
    "40001": "a serialization failure on every retry",
    "40P01": "a deadlock on every retry",
    "25006": "the server only allows reads (a standby, or default_transaction_read_only)",
    "42501": "permission denied",
    "53100": "the disk is full",
    "53200": "the server is out of memory",
    "53300": "the server has no free connection slot (max_connections)",
    "08": "the connection to the server was lost",
}


def _sqlite_name(exc: BaseException | None) -> str:
    """The SQLite error name (``SQLITE_BUSY`` ...) of a driver error wrapped by SQLAlchemy, or ''."""
    return getattr(getattr(exc, "orig", None), "sqlite_errorname", None) or ""


def _driver_of(conn: Connection) -> Any:
    """The driver's own connection under ``conn``, which is open (only a closed or invalidated
    connection has none)."""
    raw = conn.connection.driver_connection
    assert raw is not None
    return raw


def _undecodable(exc: BaseException) -> bool:
    """Whether ``exc`` is sqlite3's failure to decode a fetched TEXT value as UTF-8 (stored bytes
    that are not UTF-8: SQLite takes whatever a statement casts to TEXT).

    Told by its shape, not its text: every error SQLite itself reports carries its code
    (``sqlite_errorcode``, Python 3.11+); an ``OperationalError`` without one is raised by the
    driver, and while rows are read that is only the UTF-8 decode of a TEXT column.
    """
    orig = getattr(exc, "orig", None)
    return type(orig) is sqlite3.OperationalError and getattr(orig, "sqlite_errorcode", None) is None


# The column sqlite3 names in that failure (a name from fencepost's own statement, never a value);
# the stored bytes it quotes after it are never shown.
_UNDECODABLE_COLUMN = re.compile(r"Could not decode to UTF-8 column '([A-Za-z0-9_.()]{1,64})' with text ")


def _by_prefix(reasons: dict[str, str], code: str | None) -> str | None:
    """The entry of ``reasons`` whose key is ``code`` or the start of an extended code (``SQLITE_BUSY_TIMEOUT``)."""
    if not code:
        return None
    for prefix, reason in reasons.items():
        if code == prefix or code.startswith(prefix + "_"):
            return reason
    return None

# SQLite codes after which a connection is replaced rather than reused (the file's state at open
# time is baked into the connection).
_SQLITE_REOPEN = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_NOTADB", "SQLITE_CORRUPT")

# What a driver code means when ``fencepost.open`` fails (OpenError codes), by code or code prefix.
_SQLITE_OPEN = {
    "SQLITE_NOTADB": "not_a_database",
    "SQLITE_CORRUPT": "corrupt",
    "SQLITE_CANTOPEN": "permission_denied",
    "SQLITE_READONLY": "permission_denied",
    "SQLITE_PERM": "permission_denied",
    "SQLITE_AUTH": "permission_denied",
    "SQLITE_FULL": "disk_full",
    "SQLITE_IOERR_SHMSIZE": "disk_full",  # the -shm index could not grow (a full disk)
}
_PG_OPEN = {
    "3D000": "database_missing",  # invalid_catalog_name
    "28000": "auth_failed",  # invalid_authorization_specification (unknown role, pg_hba reject)
    "28P01": "auth_failed",  # invalid_password
    "42501": "permission_denied",  # insufficient_privilege (CREATE SCHEMA, CONNECT ...)
    "57P03": "cannot_connect",  # cannot_connect_now (starting up, shutting down)
    "53100": "disk_full",
}


class Backend:
    name: str
    migration_suffix: str
    # Compiles statements for direct execution on the DB-API connection (the hot-path executors).
    driver_dialect: DefaultDialect
    # The driver runs several parameterless statements sent as one string, in one round trip.
    joins_statements = False

    def configure(self, engine: Engine, *, readonly: bool, options: dict[str, str]) -> None:
        raise NotImplementedError

    def begin_write(self, conn: Connection) -> None:
        """Run first in every write transaction (after BEGIN)."""

    def relax_commit(self, conn: Connection) -> bool:
        """Before BEGIN of a write whose COMMIT need not wait for the disk (``write(durable=False)``):
        whether anything was relaxed on ``conn`` (then ``restore_commit`` runs after it ends)."""
        return False

    def relax_in_transaction(self, conn: Connection) -> None:
        """After ``begin_write`` of such a write: relax its COMMIT for this transaction only."""

    def restore_commit(self, conn: Connection) -> None:
        """After such a write ended (committed or not): what ``relax_commit`` changed, put back."""

    def read_options(self) -> dict[str, Any]:
        return {}

    def write_connection(self, conn: Connection) -> None:
        """Set up a connection that will run write transactions (once, when it is checked out)."""

    def wrote(self) -> None:
        """A top-level write transaction committed (called on every one: keep it cheap)."""

    def close(self) -> None:
        """The store's connections are being closed: stop whatever the backend runs beside them."""

    def transaction_open(self, dbapi_connection: Any) -> bool:
        """Whether the driver connection has a transaction open (True when it cannot tell)."""
        raise NotImplementedError

    def statement_running(self, conn: Any) -> bool:
        """Whether a statement is under way on ``conn`` (a SQLAlchemy connection of the calling
        thread), which only a signal handler or finalizer run in its middle can observe."""
        return False

    def discard_after(self, exc: BaseException | None) -> bool:
        """Whether a connection that raised ``exc`` must be replaced even though it rolled back."""
        return False

    def is_transient(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def waited_out(self, exc: BaseException, elapsed_s: float) -> bool:
        """Whether the transient failure ``exc``, ``elapsed_s`` seconds into a call, means the call has
        already waited as long as the store was told to wait for a lock: then it is not retried."""
        return False

    def classify(self, exc: BaseException) -> tuple[str, str | None]:
        """Return ``(category, code)``: category is ``constraint`` or ``persistence_failed``."""
        raise NotImplementedError

    def reason(self, exc: BaseException, code: str | None) -> str | None:
        """What the failure ``exc`` (driver code ``code``) means, as a value-free sentence for the
        error message, when the code says something a caller can act on; else None."""
        return None

    def commit_unknown(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by COMMIT, leaves the outcome unknown (the transaction may have
        committed): the connection was lost, so the database's answer never arrived."""
        return isinstance(exc, DBAPIError) and exc.connection_invalidated

    def open_problem(self, code: str | None) -> str | None:
        """The ``OpenError`` code a driver code explains when opening a store fails, if any."""
        raise NotImplementedError

    def diagnose_connect(self, engine: Engine) -> str:
        """Why connecting failed when the driver gave no code (``OpenError`` code)."""
        return "open_failed"

    def connect_refusal(self, engine: Engine) -> tuple[str | None, str | None]:
        """Why a new connection of a store already open failed when the driver gave no code, asked of
        the server: its code and a value-free reason when it refused the session (no free
        connection slot, starting up or shutting down), ``(None, reason)`` when nothing answers at
        its address, ``(None, None)`` when that cannot be told (the failure's own reason stands)."""
        return None, None

    def explain_connect(self, engine: Engine) -> tuple[str, str | None, str | None]:
        """``diagnose_connect`` with a value-free sentence that says more, when there is one, and
        the code the diagnosis found (one the driver did not pass on), if any."""
        return self.diagnose_connect(engine), None, None

    def no_answer(self, engine: Engine, exc: BaseException) -> str | None:
        """When the driver's ``exc`` says a new connection got no answer from the server within its
        connect timeout: a value-free sentence saying so (the failure is then ``cannot_connect`` and
        transient, with nothing more to ask: the server would not answer a diagnosis either)."""
        return None

    @staticmethod
    def insert(table: Any) -> Any:
        raise NotImplementedError

    def greatest(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def bulk_upsert(self, conn: Connection, table: Table, conflict: tuple[str, ...],
                    rows: list[dict[str, Any]]) -> bool:
        """Upsert ``rows`` in one statement if this backend has a faster way; False: do it the portable way."""
        return False

    def bulk_upsert_values(self, conn: Connection, table: Table, conflict: tuple[str, ...],
                           rows: list[tuple[Any, ...]]) -> bool:
        """``bulk_upsert`` for rows given as tuples of every column of ``table``, in its column order."""
        return False

    def prepare_schema(self, conn: Connection) -> None:
        """Create the namespace the store's tables live in, if the backend has one (first migration)."""

    def script_preamble(self) -> list[str]:
        """Statements a hand-applied migration script starts with (create and select the namespace)."""
        return []

    def script_epilogue(self) -> list[str]:
        """Statements a hand-applied migration script ends with (end the transaction it began)."""
        return []

    def has_table(self, conn: Connection, name: str) -> bool:
        """Whether table ``name`` exists in the store's namespace."""
        return name in self.existing_tables(conn, (name,))

    def existing_tables(self, conn: Connection, names: Collection[str]) -> set[str]:
        """Which of the tables ``names`` exist in the store's namespace: one catalog query."""
        raise NotImplementedError

    def namespace_exists(self, conn: Connection) -> bool:
        """Whether the store's namespace (a PostgreSQL schema) exists; a SQLite file is its own."""
        return True

    def split_script(self, script: str) -> list[str]:
        raise NotImplementedError

    def bound_lock_waits(self, conn: Connection, default_s: float) -> float | None:
        """First in a migration's transaction: bound each wait for a table lock in it (that
        transaction only) and return the bound in seconds; None where the backend waits for no
        table lock (SQLite: the write lock, taken at BEGIN, is bounded by its busy timeout)."""
        return None

    def unbound_lock_waits(self, conn: Connection) -> None:
        """Last in a migration's transaction: what ``bound_lock_waits`` set, put back (the rest
        of a transaction it shares with other writes waits as before)."""

    def lock_wait_expired(self, exc: BaseException) -> bool:
        """Whether the driver error ``exc`` is a statement giving up a lock wait (the bound above)."""
        return False

    def migration_lock_waited(self, code: str | None) -> bool:
        """Whether a migration's write transaction that failed with the driver code ``code`` (after
        the store's retries) gave up waiting for the lock the migration itself needs: SQLite's write
        lock, past its busy timeout. PostgreSQL bounds its migrations' table-lock waits in the
        transaction (``bound_lock_waits``); the writers' lock held past a session ``lock_timeout``
        stays an ordinary write failure there, as for any write."""
        return False

    def lock_holders(self, conn: Connection, tables: Collection[str],
                     held_s: float) -> list[tuple[str, int, str | None]]:
        """Who holds a lock on one of ``tables`` (names in the store's namespace; other words are
        ignored) in a transaction open for at least ``held_s`` seconds: ``(table, pid, state)``
        rows, ``state`` as the server reports it (``idle in transaction``) or None where it does
        not say. Never a query's text or a user name. Empty where the backend cannot tell."""
        return []

    def json_string_is(self, column: Any, key: str, value: Any) -> Any:
        """SQL true when ``column``'s top-level ``key`` is the JSON string ``value`` (change-feed listing)."""
        raise NotImplementedError

    def any_of(self, column: Any, name: str) -> Any:
        """``column`` equals one of the list bound as ``name`` (change-feed snapshot reads)."""
        raise NotImplementedError

    @property
    def kept_file(self) -> tuple[int, int] | None:
        """SQLite: the ``(device, inode)`` of the file a writable store keeps to; None otherwise."""
        return None

    def write_marker(self, conn: Connection) -> int | None:
        """An id of the open write transaction that later snapshots can be compared with (or None)."""
        return None

    def renames_safe_after(self, conn: Connection, marker: int | None) -> bool:
        """Whether a table renamed now would show every reader rows committed up to ``marker``.

        A reader whose snapshot predates a rename must not find the renamed table under the old
        name with rows it cannot see (a half-built projection). SQLite keeps the schema in the
        snapshot itself, so such a reader still sees the old table.
        """
        return True


#: ``db_code`` of a write refused because the SQLite file was deleted or replaced under the store.
FILE_REPLACED = "file_replaced"


def file_identity(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of the database file, or None when there is no file at ``path``."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def replacement_check(backend: Backend, path: Any) -> Callable[[], bool]:
    """Whether the SQLite file at ``path`` is no longer the one a writable store keeps to, or (a
    read-only store, whose connections open whatever file is at the path) the one there when this
    was called; always False without a file (PostgreSQL: the store's next connection sees a
    recreated schema). For followers: the store's connections keep an unlinked file open, so a
    database deleted and recreated would otherwise go on answering from the old file for ever."""
    if backend.name != "sqlite" or path is None:
        return lambda: False
    where = str(path)  # a store's path is absolute since it opened
    identity = backend.kept_file or file_identity(where)
    return lambda: file_identity(where) != identity


def _file_replaced(reason: str, *, reconnect: bool = False) -> Exception:
    from fencepost._durable import DbFailure

    return DbFailure("persistence_failed", FILE_REPLACED, reason, reconnect=reconnect)


def _check_file(file: list[Any]) -> None:
    """Refuse (``DbFailure`` ``file_replaced``) when a store's path ``file[0]`` no longer names the
    file ``file[1]`` it opened: deleted, or another file moved over it."""
    opened = file[1]
    if opened is None:
        return
    try:
        st = os.stat(file[0])
    except OSError:
        st = None
    if st is None or (st.st_dev, st.st_ino) != opened:
        raise _file_replaced("the database file was deleted or replaced after the store opened it; "
                             "nothing was written (open the store again to use the file now at its path)")


#: ``info`` key of a SQLite connection: ``(device, inode)`` of the file it opened, and, when it
#: opened it as immutable (see ``frozen_copy``), the file's ``(mtime_ns, ctime_ns, size)`` as it
#: stood just before (None otherwise).
_OPENED = "fencepost_opened"


def _version(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_mtime_ns, st.st_ctime_ns, st.st_size


def _check_read(info: dict[str, Any], path: str) -> None:
    """Before a read transaction: a connection whose path now names another file (or none), or an
    immutable one whose file changed since it opened it (a writer came along: a ``-shm`` index is
    beside it, or the writer already went, its commits checkpointed into the file), is replaced
    (``DbFailure`` ``file_replaced`` with ``reconnect`` set: the reader retries on a new one)."""
    opened = info.get(_OPENED)
    if opened is None:
        return
    try:
        st = os.stat(path)
    except OSError:
        st = None
    frozen = opened[1]
    if (st is None or (st.st_dev, st.st_ino) != opened[0]
            or (frozen is not None and (_version(st) != frozen
                                       # beside the file a symbolic link points to: SQLite's place
                                       or os.path.exists(os.path.realpath(path) + "-shm")))):
        raise _file_replaced("the database file was replaced while the store had it open",
                             reconnect=True)


def readonly_uri(path: str) -> str:
    """The ``file:`` URI SQLite opens ``path`` read-only through (``mode=ro``). Quoted: ``#``, ``?``
    and ``%`` in a path mean something in a URI. An absolute path gets an empty authority
    (``file:///...``): a path beginning with two slashes (which POSIX keeps, naming the same file)
    would otherwise read as ``file://authority/...``, which SQLite refuses."""
    return ("file://" if path.startswith("/") else "file:") + quote(path) + "?mode=ro"


def frozen_copy(path: str) -> bool:
    """Whether a read-only connection opens the database at ``path`` as immutable (no locking, no
    ``-shm`` index): the file is on a read-only file system, or in a directory this process may not
    write, and no ``-shm`` file is beside it. SQLite reads a WAL database through that index, and
    cannot create it there. Not when a non-empty ``-wal`` log is beside it: immutable reads would
    skip the commits still in the log, so that open fails as before.

    Immutable reads take no locks and see no later change, so a read-only store checks at the
    start of each read that no ``-shm`` file has appeared since (someone who may write the
    directory opened the database) and that the file's modification time, change time and size
    are still those it had when the connection opened it (a writer came, committed and closed the
    database, which deleted its ``-shm``): otherwise it reads through a new connection.

    A path through a symbolic link: SQLite keeps ``-wal`` and ``-shm`` beside the file the link
    points to, so they are looked for (and the directory's writability asked) there."""
    path = os.path.realpath(path)
    parent = os.path.dirname(path) or "."
    try:
        read_only = bool(os.statvfs(parent).f_flag & os.ST_RDONLY) or not os.access(parent, os.W_OK)
    except OSError:
        return False
    if not read_only or os.path.exists(path + "-shm"):
        return False
    try:
        return os.stat(path + "-wal").st_size == 0
    except OSError:
        return True


def unused_state(path: str) -> tuple[Any, ...] | None:
    """SQLite only: the file's ``(mtime_ns, ctime_ns, size)`` and its ``-wal`` log's ``(exists,
    size)`` when nobody has the database at ``path`` open and the file holds all of it (no
    ``-shm`` index, no ``-journal``, an empty or no ``-wal``), else None. Its reads may then open it
    as immutable, which creates no ``-wal``/``-shm`` beside it (see ``SqliteBackend.vetting``).
    Those files are looked for beside the file a symbolic link at ``path`` points to: SQLite keeps
    them there (a writer holding the file open through its own path would go unseen otherwise)."""
    path = os.path.realpath(path)
    if os.path.exists(path + "-shm") or os.path.exists(path + "-journal"):
        return None
    try:
        wal: tuple[bool, int] = (True, os.stat(path + "-wal").st_size)
    except OSError:
        wal = (False, 0)
    if wal[1]:
        return None
    try:
        return _version(os.stat(path)), wal
    except OSError:
        return None


def _ensure_wal(cur: sqlite3.Cursor, busy_ms: int) -> None:
    """Switch a fresh file to WAL. The switch needs the file to itself and SQLite does not wait
    for it (no busy handler): when several processes open one new file at once, a switch that
    meets another connection's lock answers SQLITE_BUSY at once. Retry until the busy timeout."""
    deadline = time.monotonic() + busy_ms / 1000
    delay = 0.002
    while True:
        try:
            # Read first: once the file is WAL, nothing needs the file to itself. A file system
            # that cannot hold WAL keeps the old mode without an error: it is kept.
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_BUSY", "SQLITE_LOCKED") \
                    or time.monotonic() >= deadline:
                raise
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 0.1)


#: SQLite URL options: ``?synchronous=`` and ``?checkpoints=`` (who copies the log into the file).
SQLITE_SYNCHRONOUS = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
SQLITE_CHECKPOINTS = frozenset({"background", "writer"})


class SqliteBackend(Backend):
    """Embedded default: one file, WAL, one writer at a time under ``BEGIN IMMEDIATE``."""

    name = "sqlite"
    migration_suffix = "sqlite"
    # Named paramstyle: the executors pass dicts straight to sqlite3.
    driver_dialect = _sqlite_pysqlite.dialect(paramstyle="named")

    def __init__(self, path: str | None = None) -> None:
        #: The database file (None for a backend that opens none, e.g. a stand-in for a missing one).
        self.path = path
        self._writers: weakref.WeakSet[Any] = weakref.WeakSet()
        # Writable stores checkpoint the log on a thread of their own (see _checkpoint.py).
        self.checkpointer: Checkpointer | None = None
        # The store's file: [its path, (device, inode) once the first connection opened it].
        # A list the engine's listeners share, so they hold no reference to the backend (a store
        # dropped without ``close`` must be collectable, its checkpoint thread stopped). Third: a
        # read-only store's new connections open as immutable while nobody else has the file
        # open (``vetting``).
        self._file: list[Any] = [None, None, False]
        self._readonly = False
        #: Seconds SQLite waits for another connection's lock (``busy_timeout_ms``).
        self.busy_wait_s = BUSY_TIMEOUT_MS / 1000
        #: The ``synchronous`` level of every connection (the URL option, FULL unless given).
        self.synchronous = "FULL"

    def configure(self, engine: Engine, *, readonly: bool, options: dict[str, str]) -> None:
        # Options were validated by parse_url before anything was created.
        synchronous = options.get("synchronous", "FULL").upper()
        self.synchronous = synchronous
        self._readonly = readonly
        # "writer": SQLite's own default, the commit that fills the log checkpoints it; no thread.
        background = options.get("checkpoints", "background") == "background"
        busy_ms = int(options.get("busy_timeout_ms", BUSY_TIMEOUT_MS))
        self.busy_wait_s = busy_ms / 1000

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
            # Take transaction control away from pysqlite: it would only BEGIN at the first
            # INSERT/UPDATE/DELETE, leaving earlier reads of a "write" outside the write lock.
            dbapi_connection.isolation_level = None
            cur = dbapi_connection.cursor()
            cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cur.execute("PRAGMA foreign_keys = ON")
            if not readonly:
                _ensure_wal(cur, busy_ms)
            cur.execute(f"PRAGMA synchronous = {synchronous}")
            if not readonly and background:
                # The checkpoint thread copies the log; a writer only does when it falls far behind.
                cur.execute(f"PRAGMA wal_autocheckpoint = {WRITER_BACKSTOP_PAGES}")
            cur.close()

        file = self._file
        if self.path:
            file[0] = self.path  # absolute: the store made it so when it opened

            @event.listens_for(engine, "do_connect")
            def _open_file(_dialect: Any, record: Any, cargs: Any, _cparams: Any) -> None:
                # Which file each connection opens, taken before it opens it: a file replaced in
                # between makes that connection look stale at once (one reconnect too many),
                # never current when it is not.
                if readonly:
                    try:
                        st = os.stat(file[0])
                    except OSError:  # never create a file at the path (mode=ro cannot anyway)
                        raise _file_replaced("the database file was deleted after the store opened it, "
                                             "and no file is at its path now") from None
                    frozen = frozen_copy(file[0]) or (file[2] and unused_state(file[0]) is not None)
                    # Quoted: ``#``, ``?`` and ``%`` in a path mean something in a URI.
                    cargs[0] = readonly_uri(file[0]) + ("&immutable=1" if frozen else "")
                    # An immutable connection also keeps the file's version: SQLite would go on
                    # trusting what it cached of a file that changed (stale rows, or "corrupt").
                    record.info[_OPENED] = ((st.st_dev, st.st_ino), _version(st) if frozen else None)
                else:
                    # The file the store opened, kept to: its connections hold that file open, so
                    # once it is deleted (or another file is moved over its path) a kept connection
                    # would commit into a file nobody can open again, and a new one would create an
                    # empty database at the path (or write into the other file). Checked before
                    # each new connection and each transaction.
                    _check_file(file)
                    record.info[_OPENED] = (file_identity(file[0]), None)

            @event.listens_for(engine, "connect")
            def _remember_file(_dbapi_connection: Any, record: Any) -> None:
                if file[1] is None:
                    file[1] = file_identity(file[0])  # the file the first connection opened (or created)
                if record.info.get(_OPENED, (None,))[0] is None:  # it created the file
                    record.info[_OPENED] = (file[1], None)

        # BEGIN (IMMEDIATE on a write connection) from the dialect's own begin step, straight to
        # the driver: no "begin" event listener, so SQLAlchemy (and the statement executor) skip
        # event dispatch entirely while nobody listens. Driver errors are wrapped by SQLAlchemy
        # as for any statement, so busy still classifies as transient. A read first checks that
        # its connection's file is still the one at the path (one ``stat``).
        writers = self._writers
        path = file[0]

        # The pool proxy's ``dbapi_connection`` is the sqlite3 connection itself (pysqlite's driver
        # connection): read as a plain attribute, not through the proxy's properties, and COMMIT
        # called on it directly (the proxy only forwards ``commit`` from its ``__getattr__``, after
        # a failed attribute lookup on every transaction).
        # The WeakSet's own set of references, asked directly: ``in writers`` costs a Python call.
        # (``WeakSet.data`` is CPython's, public in its source; typeshed leaves it out.)
        writer_refs, ref = writers.data, weakref.ref  # type: ignore[attr-defined]

        def do_begin(dbapi_connection: Any) -> None:
            if ref(dbapi_connection) in writer_refs:
                _check_file(file)
                dbapi_connection.dbapi_connection.execute("BEGIN IMMEDIATE")
            else:
                if path is not None:
                    _check_read(dbapi_connection.info, path)
                dbapi_connection.dbapi_connection.execute("BEGIN")

        def do_commit(dbapi_connection: Any) -> None:
            dbapi_connection.dbapi_connection.commit()

        engine.dialect.do_begin = do_begin  # type: ignore[method-assign]
        engine.dialect.do_commit = do_commit  # type: ignore[method-assign]
        if not readonly and background and self.path:
            self.checkpointer = Checkpointer(self.path, synchronous)
            # A store dropped without ``close`` does not leave its thread (and connection) behind.
            weakref.finalize(self, self.checkpointer.close, False)
            # Every commit calls ``wrote``: straight to the checkpointer's, one call fewer.
            self.wrote = self.checkpointer.wrote  # type: ignore[method-assign]

    @property
    def kept_file(self) -> tuple[int, int] | None:
        """``(device, inode)`` of the file a writable store keeps to (its connections refuse any
        other file at its path), once its first connection opened it; None for a read-only store,
        whose connections open whatever file is at the path, and before any connection."""
        return None if self._readonly else self._file[1]

    @property
    def vetting(self) -> bool:
        """SQLite only: while set, a read-only store's new connections open the file as immutable
        when nobody has it open (``unused_state``), so reading it creates no ``-wal``/``-shm``
        beside it. For the reads that decide whether a read-only open is refused: each is checked
        at its start as any immutable read is (``_check_read``), and the caller checks afterwards
        that nothing changed meanwhile (``Database.vetted``)."""
        return bool(self._file[2])

    @vetting.setter
    def vetting(self, on: bool) -> None:
        self._file[2] = on

    def write_connection(self, conn: Connection) -> None:
        # The checkout (pool proxy) of a write connection: its transactions take the write lock.
        self._writers.add(conn.connection)

    def relax_commit(self, conn: Connection) -> bool:
        # In WAL mode NORMAL keeps every commit atomic and the file consistent; only the fsync of
        # the log at COMMIT is skipped, so a power loss may undo the latest such commits (never
        # part of one). The next FULL commit on the file syncs the log, earlier frames included.
        # The level cannot change inside a transaction: set here, before BEGIN.
        if self.synchronous not in ("FULL", "EXTRA"):
            return False
        _driver_of(conn).execute("PRAGMA synchronous = NORMAL")
        return True

    def restore_commit(self, conn: Connection) -> None:
        _driver_of(conn).execute(f"PRAGMA synchronous = {self.synchronous}")

    def wrote(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.wrote()

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()

    def transaction_open(self, dbapi_connection: Any) -> bool:
        return bool(dbapi_connection.in_transaction)

    def discard_after(self, exc: BaseException | None) -> bool:
        # A file opened while it was read-only stays read-only on that connection; a file that
        # could not be opened, or failed I/O, may be fine on a new one. A connection to a deleted
        # file keeps its disk space in use while it is open.
        if getattr(exc, "code", None) == FILE_REPLACED:
            return True
        return _sqlite_name(exc).startswith(_SQLITE_REOPEN)

    def is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, DBAPIError):
            return exc.connection_invalidated or _sqlite_name(exc) in _SQLITE_TRANSIENT
        return False

    def migration_lock_waited(self, code: str | None) -> bool:
        return bool(code) and str(code).startswith("SQLITE_BUSY")

    def waited_out(self, exc: BaseException, elapsed_s: float) -> bool:
        # SQLite answers busy once its busy handler has waited busy_timeout_ms for the lock: that
        # option bounds the whole call's wait, not each attempt's. A busy answer that comes sooner
        # (the handler is not asked when waiting could deadlock) is retried as before.
        return _sqlite_name(exc).startswith("SQLITE_BUSY") and elapsed_s >= self.busy_wait_s

    def classify(self, exc: BaseException) -> tuple[str, str | None]:
        name = _sqlite_name(exc) or None
        if name and name.startswith("SQLITE_CONSTRAINT"):
            return "constraint", name
        if name is None and _undecodable(exc):
            return "decode_failed", None
        return "persistence_failed", name

    def reason(self, exc: BaseException, code: str | None) -> str | None:
        if code is None and _undecodable(exc):
            column = _UNDECODABLE_COLUMN.match(str(exc.orig))  # type: ignore[attr-defined]
            where = f" in column '{column.group(1)}'" if column else ""
            return f"a stored text value{where} is not valid UTF-8"
        if code == "SQLITE_ERROR" and str(getattr(exc, "orig", "")).startswith(("no such table", "no such column")):
            return MISSING_OBJECT
        return _by_prefix(_SQLITE_REASONS, code)

    def commit_unknown(self, exc: BaseException) -> bool:
        # An I/O error at COMMIT may come after the commit record reached the log (a failed sync):
        # the next open's recovery can find it there.
        return super().commit_unknown(exc) or _sqlite_name(exc).startswith("SQLITE_IOERR")

    def open_problem(self, code: str | None) -> str | None:
        return _by_prefix(_SQLITE_OPEN, code)

    @staticmethod
    def insert(table: Any) -> Any:
        return sqlite_dialect.insert(table)

    def existing_tables(self, conn: Connection, names: Collection[str]) -> set[str]:
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return set()
        marks = ", ".join("?" * len(wanted))
        rows = conn.exec_driver_sql(
            f"SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ({marks})", tuple(wanted)
        )
        return {str(name) for (name,) in rows}

    def greatest(self, a: Any, b: Any) -> Any:
        return func.max(a, b)

    def any_of(self, column: Any, name: str) -> Any:
        return column.in_(bindparam(name, expanding=True))

    def json_string_is(self, column: Any, key: str, value: Any) -> Any:
        path = literal("$." + key)
        return case((func.json_type(column, path) == "text", func.json_extract(column, path)), else_=None) == value

    def split_script(self, script: str) -> list[str]:
        # A statement can end only at a semicolon; ``complete_statement`` tells the ones that end it
        # from those inside a trigger body, a string literal or a comment. Cutting at every such
        # semicolon (not at line ends) also separates two statements that share a line: sqlite3
        # executes one statement per call.
        statements: list[str] = []
        buffer = ""
        for piece in re.split(r"(?<=;)", script):
            buffer += piece
            if sqlite3.complete_statement(buffer):
                stmt = buffer.strip()
                if _strip_comments(stmt):
                    statements.append(stmt)
                buffer = ""
        if _strip_comments(buffer.strip()):
            raise ValueError("migration script ends with an incomplete statement")
        return statements


# The code (``db_code``) of a PostgreSQL database refused for its encoding: the setting it comes from.
_NOT_UTF8_CODE = "server_encoding"
_ENCODING_NAME = re.compile(r"^[A-Za-z0-9_]{1,32}$")


def _not_utf8(encoding: str | None) -> Exception:
    """The driver error a new connection to a database whose encoding is not UTF8 fails with.

    A driver error (psycopg's ``NotSupportedError``), so SQLAlchemy wraps it like any refused
    connection and it reaches ``fencepost.open`` (or a later call) through the usual failure path;
    ``fencepost_encoding`` carries the encoding's name, which ``classify`` and ``reason`` read.
    """
    import psycopg

    name = encoding if encoding and _ENCODING_NAME.match(encoding) else "not UTF8"
    err = psycopg.NotSupportedError(f"the database's encoding is {name}, not UTF8")
    err.fencepost_encoding = name  # type: ignore[attr-defined]
    return err


# The code (``db_code``) of a writable store refused because its sessions fire no triggers, and why.
_REPLICA_CODE = "session_replication_role"
_REPLICA_REASON = ("the session's session_replication_role is replica, so PostgreSQL fires none of the "
                   "store's triggers (change-feed revisions, lease release, the journal's append-only "
                   "rule); a writable store needs it origin (ALTER ROLE ... RESET session_replication_role)")


def _fires_no_triggers() -> Exception:
    """The driver error a new connection of a writable store fails with when its session fires no
    ordinary triggers (``session_replication_role = replica``): like ``_not_utf8``, a driver error
    carrying the setting's name (``fencepost_setting``), which ``classify`` and ``reason`` read."""
    import psycopg

    err = psycopg.NotSupportedError("session_replication_role is replica")
    err.fencepost_setting = _REPLICA_CODE  # type: ignore[attr-defined]
    return err


def _pg_begin(lock: str, *, lock_ms: int | None, lift_statement_timeout: bool) -> Sql:
    """BEGIN and the write lock as one string, its wait bounded by ``lock_ms`` (``SET LOCAL
    lock_timeout`` around it alone; None: the session's own lock_timeout) and, with
    ``lift_statement_timeout``, not cut short by the session's ``statement_timeout`` (lifted around
    it alone). The rest of the transaction keeps the session's settings: each is kept aside first and
    put back after, exactly (TO DEFAULT would give the session's startup value, losing a SET made on
    the connection since). 0 would be no limit to the server: 1 ms is "do not wait"."""
    names = (["lock_timeout"] if lock_ms is not None else []) + (
        ["statement_timeout"] if lift_statement_timeout else [])
    if not names:
        return Sql(text(f"BEGIN; {lock}"))
    keep = ", ".join(f"set_config('fencepost.{n}', current_setting('{n}'), true)" for n in names)
    back = ", ".join(f"set_config('{n}', current_setting('fencepost.{n}'), true)" for n in names)
    sets = (f"SET LOCAL lock_timeout = {max(lock_ms, 1)}; " if lock_ms is not None else "") + (
        "SET LOCAL statement_timeout = 0; " if lift_statement_timeout else "")
    return Sql(text(f"BEGIN; SELECT {keep}; {sets}{lock}; SELECT {back}"))


# Which of a list of tables exist in a schema: one statement, the names bound as one array.
_PG_TABLES = text("SELECT tablename FROM pg_tables WHERE schemaname = :s AND tablename = ANY(:t)").bindparams(
    bindparam("t", type_=pg_dialect.ARRAY(Text())))


# Sessions holding a lock on one of a list of tables of a schema, in a transaction open at least a
# given time (so through a migration's wait, not a reader that came along after it). The pid and the
# state only: another role's state reads NULL without pg_read_all_stats; never the query or the user.
_PG_LOCK_HOLDERS = text(
    "SELECT DISTINCT c.relname, l.pid, a.state FROM pg_locks l "
    "JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace "
    "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.granted AND l.locktype = 'relation' AND n.nspname = :s AND c.relname = ANY(:t) "
    "AND l.pid <> pg_backend_pid() "
    "AND (a.xact_start IS NULL OR a.xact_start <= clock_timestamp() - make_interval(secs => :held)) "
    "ORDER BY 1, 2 LIMIT 5").bindparams(bindparam("t", type_=pg_dialect.ARRAY(Text())))


class PostgresBackend(Backend):
    """Scale-out backend: psycopg 3, tables in one schema, writers serialized per schema."""

    name = "postgresql"
    migration_suffix = "postgresql"
    driver_dialect = _pg_psycopg.dialect()
    joins_statements = True

    def __init__(self, schema: str) -> None:
        problem = schema_problem(schema)
        if problem:
            raise ValueError(problem)
        self.schema = schema
        # BEGIN and the write lock as one string: one round trip where psycopg would send its own
        # BEGIN first. The schema name is inlined (validated above: no quote can appear in it).
        lock = f"SELECT pg_advisory_xact_lock(hashtextextended('{schema}', {_PG_WRITE_LOCK_CLASS}))"
        self._begin_unbounded = _pg_begin(lock, lock_ms=None, lift_statement_timeout=False)
        self._lock = lock
        #: Seconds a write waits for the write lock in all (``busy_timeout_ms``), as on SQLite.
        self.busy_wait_s = BUSY_TIMEOUT_MS / 1000

    def configure(self, engine: Engine, *, readonly: bool, options: dict[str, str]) -> None:
        schema = self.schema
        explicit = "busy_timeout_ms" in options
        busy_ms = int(options.get("busy_timeout_ms", BUSY_TIMEOUT_MS))
        self.busy_wait_s = busy_ms / 1000
        # The write lock's own wait is bounded by SET LOCAL lock_timeout around it alone; the rest
        # of the transaction keeps the session's setting, so a caller's statement waiting for a row
        # is not cut short. A session's statement_timeout is lifted around it alone too: the wait
        # is fencepost's own, bounded by busy_timeout_ms, and the caller's statements keep it.
        # By (lock bounded, statement_timeout lifted): the four BEGINs a connection may need.
        begins = {(bound, lift): _pg_begin(self._lock, lock_ms=busy_ms if bound else None,
                                           lift_statement_timeout=lift)
                  for bound in (False, True) for lift in (False, True)}

        # First of the connect listeners, before SQLAlchemy's own first-connect setup, which
        # cannot even read the server's version from a SQL_ASCII database (psycopg returns its
        # text as bytes). The encoding came with the login: no round trip.
        @event.listens_for(engine, "connect", insert=True)
        def _check_encoding(dbapi_connection: Any, _record: Any) -> None:
            encoding = dbapi_connection.info.parameter_status("server_encoding")
            if encoding != "UTF8":
                dbapi_connection.close()
                raise _not_utf8(encoding)

        @event.listens_for(engine, "handle_error")
        def _let_go(context: Any) -> None:
            # A new connection that failed (no connection yet): psycopg's connect frame, holding the
            # half-open connection, is kept in a reference cycle through the error's traceback, so
            # the socket of a connect that timed out on a server that never answered stayed open
            # until Python's cycle collector happened to run. Clear the driver's finished frames:
            # it closes now. The error itself is kept whole.
            if context.connection is None:
                tb = getattr(context.original_exception, "__traceback__", None)
                if tb is not None:
                    traceback.clear_frames(tb)

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            # search_path is set per connection; the schema name was validated above. The same
            # round trip reads the session's lock_timeout: a session that sets its own (the URL's
            # options, PGOPTIONS, the role's settings) keeps it for the write lock too, unless the
            # URL gives busy_timeout_ms; one with none waits busy_timeout_ms's default, never for ever.
            # And its statement_timeout, lifted around the write lock's wait when it has one, and
            # its session_replication_role: a session in replica mode fires none of the store's
            # triggers, so a writable store refuses it (a read-only one fires none anyway).
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            _, own, statement, role = dbapi_connection.execute(
                f"SELECT set_config('search_path', '\"{schema}\"', false), current_setting('lock_timeout'), "
                "current_setting('statement_timeout'), current_setting('session_replication_role')"
            ).fetchone()
            dbapi_connection.autocommit = autocommit
            if role == "replica" and not readonly:
                dbapi_connection.close()
                raise _fires_no_triggers()
            # Per connection (its pool record), as the session's settings are.
            _record.info[_BEGIN_KEY] = begins[(explicit or own in ("0", "0ms"), statement not in ("0", "0ms"))]

    def begin_write(self, conn: Connection) -> None:
        # One writer per schema, as upstream: revisions and journal positions are allocated
        # in commit order only because every write transaction takes this lock first.
        # Write connections run in the driver's autocommit mode (see write_connection): psycopg
        # sent no BEGIN, so ours goes with the lock.
        run(conn, conn.info.get(_BEGIN_KEY) or self._begin_unbounded, None)

    def relax_in_transaction(self, conn: Connection) -> None:
        # COMMIT returns before the server flushed its log: a server crash may undo the latest
        # such transactions (whole), never corrupt; reverts by itself when the transaction ends.
        conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")

    def read_options(self) -> dict[str, Any]:
        return {"isolation_level": "REPEATABLE READ", "postgresql_readonly": True}

    def write_connection(self, conn: Connection) -> None:
        # psycopg leaves transaction control to us on these connections, so begin_write can send
        # BEGIN together with the lock; COMMIT and ROLLBACK still end the transaction as usual.
        conn.execution_options(isolation_level="AUTOCOMMIT")

    def statement_running(self, conn: Any) -> bool:
        # psycopg waits for the server in Python code holding the connection's lock, so a signal
        # handler can run there; SQLite runs a statement in C, where none can.
        if conn.closed or conn.invalidated:
            return False
        lock = getattr(conn.connection.dbapi_connection, "lock", None)
        return lock is not None and lock.locked()

    def transaction_open(self, dbapi_connection: Any) -> bool:
        from psycopg.pq import TransactionStatus

        return dbapi_connection.info.transaction_status != TransactionStatus.IDLE

    def is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, DBAPIError):
            if self._lost(exc):
                return True
            code = getattr(exc.orig, "sqlstate", None)
            return code is not None and code in _PG_TRANSIENT_CODES
        return False

    def bound_lock_waits(self, conn: Connection, default_s: float) -> float | None:
        # The session's own lock_timeout (a URL's ``options=-c lock_timeout=...``) when it has one,
        # else ``default_s``: never the server's default of waiting for ever, which queues every
        # later reader of the table behind the migration's request. SET LOCAL: it ends with the
        # transaction, so a pooled connection keeps its own setting.
        setting = int(conn.exec_driver_sql("SELECT setting FROM pg_settings WHERE name = 'lock_timeout'").scalar_one())
        if setting > 0:
            return setting / 1000
        ms = max(1, round(default_s * 1000))
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")
        return ms / 1000

    def unbound_lock_waits(self, conn: Connection) -> None:
        conn.exec_driver_sql("SET LOCAL lock_timeout TO DEFAULT")

    def lock_wait_expired(self, exc: BaseException) -> bool:
        return isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) == "55P03"

    def lock_holders(self, conn: Connection, tables: Collection[str],
                     held_s: float) -> list[tuple[str, int, str | None]]:
        rows = conn.execute(_PG_LOCK_HOLDERS, {"s": self.schema, "t": sorted(set(tables)), "held": held_s})
        return [(str(r[0]), int(r[1]), None if r[2] is None else str(r[2])) for r in rows]

    def waited_out(self, exc: BaseException, elapsed_s: float) -> bool:
        # A new connection that got no answer has already waited its whole connect_timeout: trying
        # again within the call would multiply that wait by the store's retries (twelve timeouts).
        # The call fails as transient at once, and its caller (a worker, a follower) waits it out.
        # A lock wait given up (the write lock past busy_timeout_ms, or any lock past the session's
        # lock_timeout) is retried only while the call has waited less than busy_timeout_ms in all.
        return _pg_timed_out(exc) or (self.lock_wait_expired(exc) and elapsed_s >= self.busy_wait_s)

    @staticmethod
    def _lost(exc: DBAPIError) -> bool:
        """The connection is gone: invalidated, a connection-class code, the server ending the
        session (``pg_terminate_backend``, shutdown), or a dropped socket (no code at all)."""
        if exc.connection_invalidated:
            return True
        code = getattr(exc.orig, "sqlstate", None)
        if code is None:
            # psycopg raises OperationalError without a sqlstate when the socket drops, and its
            # subclass ConnectionTimeout when a new connection got no answer within connect_timeout.
            return any(c.__name__ in {"OperationalError", "InterfaceError"} for c in type(exc.orig).__mro__)
        return code in _PG_LOST_CODES or code[:2] in _PG_TRANSIENT_CLASSES

    def commit_unknown(self, exc: BaseException) -> bool:
        # A session ended for idling in its transaction rolled the transaction back first.
        return (isinstance(exc, DBAPIError) and self._lost(exc)
                and getattr(exc.orig, "sqlstate", None) != _PG_ENDED_UNCOMMITTED)

    def reason(self, exc: BaseException, code: str | None) -> str | None:
        orig = getattr(exc, "orig", None)
        encoding = getattr(orig, "fencepost_encoding", None)
        if encoding is not None:
            return (f"the database's encoding is {encoding}, and fencepost needs a UTF8 database "
                    "(CREATE DATABASE ... ENCODING 'UTF8')")
        if getattr(orig, "fencepost_setting", None) == _REPLICA_CODE:
            return _REPLICA_REASON
        if code in _PG_SESSION_ENDED:
            return _PG_SESSION_ENDED[code]
        if isinstance(exc, DBAPIError) and self._lost(exc):
            return "the connection to the server was lost"
        if code is None:
            return None
        return _PG_REASONS.get(code) or _PG_REASONS.get(code[:2])

    def classify(self, exc: BaseException) -> tuple[str, str | None]:
        orig = getattr(exc, "orig", None)
        if getattr(orig, "fencepost_encoding", None) is not None:
            return "persistence_failed", _NOT_UTF8_CODE
        if getattr(orig, "fencepost_setting", None) is not None:
            return "persistence_failed", str(orig.fencepost_setting)  # type: ignore[union-attr]
        code = getattr(orig, "sqlstate", None)
        if code and code.startswith("23"):
            return "constraint", code
        return "persistence_failed", code

    def open_problem(self, code: str | None) -> str | None:
        if code is None:
            return None
        return _PG_OPEN.get(code) or ("cannot_connect" if code[:2] == "08" else None)

    def diagnose_connect(self, engine: Engine) -> str:
        return self.explain_connect(engine)[0]

    def explain_connect(self, engine: Engine) -> tuple[str, str | None, str | None]:
        """libpq reports a refused connection without a SQLSTATE, so find out by asking, never by
        reading its message: does the host name resolve, and does anything listen at the address;
        does the server refuse the session itself, before or just after the login (its SQLSTATE, read
        from the protocol's startup exchange: no free connection slot, starting up or shutting down);
        does the server let these credentials, with the URL's own connection options, into a
        maintenance database; does the named database exist there. When it lets them in only
        without the URL's options (a bad ``sslmode`` or ``connect_timeout``, SSL the server lacks
        ...), the credentials are not the problem: ``open_failed``, with a sentence naming the
        options the failure depends on."""
        url = engine.url
        _, kwargs = engine.dialect.create_connect_args(url)
        try:
            refused = _pg_refusal(kwargs)
        except socket.gaierror:
            return "cannot_connect", _HOST_UNRESOLVED, None
        except OSError:
            return "cannot_connect", None, None
        database = kwargs.get("dbname")
        if refused == _PG_SILENT:
            # Every credential probe would wait out its own timeout on it, to no end.
            return "cannot_connect", _pg_no_answer_note(_pg_probe_timeout(kwargs)), None
        if refused == _PG_FOREIGN:
            # No credentials are at fault, and waiting cures no wrong port.
            return "open_failed", _PG_FOREIGN_NOTE, None
        if refused == _PG_CLOSED:
            # No login was even asked for; what is behind the address may come back.
            return "cannot_connect", _PG_CLOSED_NOTE, None
        if refused in _PG_REFUSALS:
            return "cannot_connect", _PG_REFUSALS[refused], refused
        options = sorted(k for k in url.query if k not in _PG_IDENTITY)
        for maintenance in ("postgres", "template1"):
            if maintenance == database:
                continue
            found = _pg_let_in(engine, options, maintenance, database)
            if found is not None:
                # In, but not into the named database: it is missing, or these credentials may not use it.
                return ("permission_denied" if found else "database_missing"), None, None
            if options and _pg_let_in(engine, (), maintenance, None) is not None:
                return "open_failed", _pg_options_note(_pg_blamed(engine, options, maintenance)), None
        # Let in nowhere. A server that was taking sessions when first asked may have filled up
        # since (connection slots come and go): only a server that still takes them refused the login.
        try:
            refused = _pg_refusal(kwargs)
        except OSError:
            return "cannot_connect", None, None
        if refused in _PG_REFUSALS:
            return "cannot_connect", _PG_REFUSALS[refused], refused
        if refused == _PG_SILENT or refused == _PG_CLOSED:  # it stopped answering meanwhile
            return "cannot_connect", None, None
        return "auth_failed", None, None

    def connect_refusal(self, engine: Engine) -> tuple[str | None, str | None]:
        # The startup probe of ``explain_connect``: no login is attempted, so it is cheap and safe
        # to ask while the store is open.
        _, kwargs = engine.dialect.create_connect_args(engine.url)
        try:
            refused = _pg_refusal(kwargs)
        except socket.gaierror:
            return None, "the server's host name could not be resolved"
        except OSError:
            return None, "no server accepts connections at the store's address"
        if refused == _PG_SILENT:
            return None, _pg_no_answer_note(_pg_probe_timeout(kwargs))
        if refused == _PG_FOREIGN:
            return None, "what answers at the store's address is not a PostgreSQL server"
        if refused == _PG_CLOSED:
            return None, _PG_CLOSED_NOTE
        if refused in _PG_REFUSALS:
            return refused, _PG_REFUSALS[refused]
        return None, None

    def no_answer(self, engine: Engine, exc: BaseException) -> str | None:
        if not _pg_timed_out(exc):
            return None
        _, kwargs = engine.dialect.create_connect_args(engine.url)
        return _pg_no_answer_note(pg_connect_timeout(kwargs))

    @staticmethod
    def insert(table: Any) -> Any:
        return pg_dialect.insert(table)

    def bulk_upsert(self, conn: Connection, table: Table, conflict: tuple[str, ...],
                    rows: list[dict[str, Any]]) -> bool:
        # One INSERT ... SELECT FROM json_populate_recordset(the page as one JSON text): one round
        # trip for the page instead of one pipelined statement per row, and the page is encoded by
        # msgspec in one call instead of being dumped array element by array element.
        sql = _json_upsert_of(conn, table, conflict)
        if sql is None:
            return False
        # A JSON member that is missing would be stored as NULL: refuse the page, as the
        # row-by-row path does (KeyError), before anything is sent.
        names = statement_cached(table, "column names", lambda: frozenset(c.name for c in table.columns))
        for row in rows:
            if not row.keys() >= names:
                raise KeyError(sorted(names - row.keys())[0])
        conn.exec_driver_sql(sql, {"rows": _encode_rows(rows).decode()})
        return True

    def bulk_upsert_values(self, conn: Connection, table: Table, conflict: tuple[str, ...],
                           rows: list[tuple[Any, ...]]) -> bool:
        # The same statement, each tuple encoded as the JSON object of its columns through a struct
        # type made once per table: about eight times faster than building a dict per row first.
        sql = _json_upsert_of(conn, table, conflict)
        if sql is None:
            return False
        row_type = statement_cached(table, "json row", lambda: _json_row_type(table))
        conn.exec_driver_sql(sql, {"rows": _encode_rows([row_type(*row) for row in rows]).decode()})
        return True

    def prepare_schema(self, conn: Connection) -> None:
        conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')

    def script_preamble(self) -> list[str]:
        # Its own transaction, and the path set for that transaction only: a DBA who pastes the
        # script into a session keeps the session's own search_path afterwards.
        return ["BEGIN", f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"', f'SET LOCAL search_path TO "{self.schema}"']

    def script_epilogue(self) -> list[str]:
        return ["COMMIT"]

    def existing_tables(self, conn: Connection, names: Collection[str]) -> set[str]:
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return set()
        rows = conn.execute(_PG_TABLES, {"s": self.schema, "t": wanted})
        return {str(name) for (name,) in rows}

    def namespace_exists(self, conn: Connection) -> bool:
        return conn.execute(text("SELECT 1 FROM pg_namespace WHERE nspname = :s"), {"s": self.schema}).first() \
            is not None

    def greatest(self, a: Any, b: Any) -> Any:
        return func.greatest(a, b)

    def any_of(self, column: Any, name: str) -> Any:
        # One array parameter: PostgreSQL parses and plans `IN` with 200 parameters ~5x slower.
        return column == func.any(bindparam(name, type_=pg_dialect.ARRAY(Text())))

    def json_string_is(self, column: Any, key: str, value: Any) -> Any:
        # One parse of the text per row, compared as JSON: a string equals only a string (the
        # former CASE on jsonb_typeof parsed every row's text twice, about twice the time).
        field = column.cast(pg_dialect.JSONB).op("->")(literal(key))
        return field == func.to_jsonb(cast(value, Text))

    def split_script(self, script: str) -> list[str]:
        # PostgreSQL accepts a whole script in one simple-protocol execute.
        return [script]

    def write_marker(self, conn: Connection) -> int | None:
        return int(conn.exec_driver_sql("SELECT pg_current_xact_id()::text").scalar_one())

    def renames_safe_after(self, conn: Connection, marker: int | None) -> bool:
        # Catalog lookups are not MVCC: after a rename commits, a reader whose snapshot is older
        # than the rows of the renamed table finds the table by its new name and misses those rows.
        # Safe only when no other session of this database holds a snapshot that may not see the
        # transaction ``marker`` (its xmin at or before it); sessions that start later see it.
        if marker is None:
            return False
        old = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL "
            "AND age(backend_xmin) >= age(xid(%(marker)s::text::xid8))",
            {"marker": marker},
        ).scalar()
        return old == 0


# Where a PostgreSQL connection's pool record keeps its BEGIN (the write lock bounded or not).
_BEGIN_KEY = "fencepost_begin"
_PG_WRITE_LOCK_CLASS = 2099  # the advisory lock class of the per-schema write lock

# URL query options that say who connects and to which database: kept in every diagnosis probe, so a
# problem with them still reads as one (an unknown ``?user=`` is ``auth_failed``). The other options
# (``sslmode``, ``connect_timeout``, ``host`` ...) are what the probes leave out to see whether the
# failure depends on them.
_PG_IDENTITY = frozenset({"user", "password", "passfile", "dbname"})
# The most options whose part in a failure is narrowed down one by one; past that, all are named.
_PG_NARROW_MAX = 8


def _pg_let_in(engine: Engine, keep: Collection[str], maintenance: str, database: str | None) -> bool | None:
    """Connect as the engine's URL would with only the query options in ``keep`` (and the identity
    ones), to database ``maintenance``: ``None`` when refused, else whether ``database`` exists
    (False when no database is asked about)."""
    import psycopg

    url = engine.url
    probe = url.set(query={k: v for k, v in url.query.items() if k in _PG_IDENTITY or k in keep})
    _, kwargs = engine.dialect.create_connect_args(probe)
    # A URL's own connect_timeout is kept (a bad one fails this probe as it failed the open).
    kwargs = {"connect_timeout": 5, **kwargs, "dbname": maintenance}
    try:
        with psycopg.connect(**kwargs) as conn:
            if database is None:
                return False
            row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
    except psycopg.Error:
        return None
    return row is not None


def _pg_blamed(engine: Engine, options: list[str], maintenance: str) -> list[str]:
    """The options (of ``options``, which fail together) that the failure depends on: each one that
    fails alone, else each one without which the rest connect, else all of them."""
    if len(options) == 1 or len(options) > _PG_NARROW_MAX:
        return options
    alone = [o for o in options if _pg_let_in(engine, (o,), maintenance, None) is None]
    if alone:
        return alone
    needed = [o for o in options
              if _pg_let_in(engine, [k for k in options if k != o], maintenance, None) is not None]
    return needed or options


def _pg_options_note(names: list[str]) -> str:
    """The sentence an ``open_failed`` diagnosis adds: option names only, never their values."""
    if len(names) == 1:
        return f"the connection fails with the URL option {names[0]} and succeeds without it"
    listed = f"{', '.join(names[:-1])} and {names[-1]}"
    return f"the connection fails with the URL options {listed}, and succeeds without them"


# Why a server that answers refuses a session, by the SQLSTATE it ends the startup exchange with:
# conditions that end by themselves (``cannot_connect``, transient). Both come before the server
# checks who connects, so the probe needs no credentials (the reserved-slot refusal of 53300 comes
# just after a login that needs no password, and the probe reads on past that).
_PG_REFUSALS = {
    "53300": "the server has no free connection slot (max_connections); retry once other sessions end",
    "57P03": "the server is starting up or shutting down; retry once it accepts connections",
}
_HOST_UNRESOLVED = "its host name could not be resolved"
_PG_PROTOCOL_3 = 196608  # protocol version 3.0, as the startup message spells it
_SQLSTATE = re.compile(rb"^[0-9A-Z]{5}$")
_PROBE_TIMEOUT_S = 5
# What the startup probe returns for a server that took the connection and sent nothing back.
_PG_SILENT = "no answer"
# What it returns for a peer whose first answer is no PostgreSQL message (an SSH daemon, an HTTP
# server or proxy, a MySQL server: a wrong port), and what the open then says.
_PG_FOREIGN = "not postgresql"
_PG_FOREIGN_NOTE = "what answers at its host and port is not a PostgreSQL server; check the port"
# What it returns for a peer that takes the connection and closes it without a word (a proxy or load
# balancer with no server behind it, a connection limiter, a server going down), and what is said.
_PG_CLOSED = "closed"
_PG_CLOSED_NOTE = "the server closed the connection without answering; retry once it serves again"
# The messages a server may answer a startup message with first: an authentication request, an
# error, a notice, or a protocol version negotiation.
_PG_FIRST_KINDS = frozenset(b"REN" b"v")
# A store's connect_timeout when its URL gives none (libpq's own default is to wait forever).
PG_CONNECT_TIMEOUT_S = 10
#: How long a write waits for another connection's write lock unless ``busy_timeout_ms`` says
#: (SQLite's busy timeout; on PostgreSQL the ``lock_timeout`` of the write lock's statement).
BUSY_TIMEOUT_MS = 10_000


def pg_connect_timeout(kwargs: Mapping[str, Any]) -> int:
    """The seconds a new connection waits for the server, from the driver's connect arguments as a
    store's engine gets them: the URL's ``connect_timeout`` (else fencepost's default), read as
    libpq does (whole seconds, at least 2; 0 or less waits as long as the driver's own bound)."""
    try:
        value = int(float(kwargs.get("connect_timeout", PG_CONNECT_TIMEOUT_S)))
    except (TypeError, ValueError):
        return PG_CONNECT_TIMEOUT_S
    return 130 if value <= 0 else max(value, 2)


def _pg_probe_timeout(kwargs: Mapping[str, Any]) -> int:
    """How long the startup probe waits for the server: the store's connect timeout, at most
    ``_PROBE_TIMEOUT_S``."""
    return min(pg_connect_timeout(kwargs), _PROBE_TIMEOUT_S)


def _pg_timed_out(exc: BaseException) -> bool:
    """Whether the driver's ``exc`` says a new connection got no answer within its connect timeout:
    told by the exception's class (psycopg's ``ConnectionTimeout``), never its message."""
    orig = getattr(exc, "orig", None)
    return any(c.__name__ == "ConnectionTimeout" for c in type(orig).__mro__)


def _pg_no_answer_note(seconds: int) -> str:
    return f"the server did not answer within {seconds} s (connect_timeout); retry once it answers"


def _pg_addresses(kwargs: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Where the driver connects, from its connect arguments as libpq reads them: ``hostaddr`` over
    ``host`` (a URL's ``?host=/socket/dir&port=`` leaves the URL's own host and port empty), each
    a comma-separated list tried in turn, then ``PGHOSTADDR``/``PGHOST``/``PGPORT``, then the
    default socket directory and 5432. Raises ``ValueError`` for a port that is not a number."""

    def listed(key: str, env: str) -> list[str]:
        value = kwargs.get(key)
        value = str(value) if value not in (None, "") else os.environ.get(env, "")
        return value.split(",") if value else []

    hosts, addrs, ports = listed("host", "PGHOST"), listed("hostaddr", "PGHOSTADDR"), listed("port", "PGPORT")
    count = max(len(hosts), len(addrs), 1)
    found = []
    for i in range(count):
        addr = addrs[i] if i < len(addrs) else ""
        host = hosts[i] if i < len(hosts) else ""
        port = ports[i] if i < len(ports) else (ports[0] if len(ports) == 1 else "")
        found.append((addr or host or "/var/run/postgresql", int(port or 5432)))
    return found


def _pg_reach(kwargs: Mapping[str, Any], timeout: float = _PROBE_TIMEOUT_S) -> socket.socket:
    """A socket connected to the first address of ``_pg_addresses`` that accepts one (as libpq
    tries them); the last failure when none does (``socket.gaierror`` when no host name resolves)."""
    try:
        addresses = _pg_addresses(kwargs)
    except ValueError:
        raise OSError("the port is not a number") from None
    failure: OSError | None = None
    for host, port in addresses:
        try:
            return _pg_socket(host, port, timeout)
        except socket.gaierror as exc:
            if failure is None or isinstance(failure, socket.gaierror):
                failure = exc  # "does not resolve" only when no address was reachable otherwise
        except OSError as exc:
            failure = exc
    assert failure is not None
    raise failure


def _pg_refusal(kwargs: Mapping[str, Any]) -> str | None:
    """The SQLSTATE with which the server the driver connects to (its connect arguments ``kwargs``)
    refuses a session at startup, else None (``_pg_startup_refusal``); ``OSError`` when nothing
    answers there (``socket.gaierror`` when no host name resolves)."""
    timeout = _pg_probe_timeout(kwargs)
    sock = _pg_reach(kwargs, timeout)
    user = kwargs.get("user") or os.environ.get("PGUSER") or _os_user()
    with sock:
        return _pg_startup_refusal(sock, user, kwargs.get("dbname") or os.environ.get("PGDATABASE") or user,
                                   timeout=timeout)


def _pg_socket(host: str, port: int, timeout: float = _PROBE_TIMEOUT_S) -> socket.socket:
    """A connected socket to the server at ``host`` (a Unix socket directory when it starts with
    ``/``) and ``port``; ``socket.gaierror`` when the host name does not resolve."""
    if host.startswith("/"):
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.settimeout(timeout)
            sock.connect(f"{host}/.s.PGSQL.{port}")
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection((host, port), timeout=timeout)


def _os_user() -> str:
    """The user name libpq falls back on (the process's), or '' where there is none to find."""
    try:
        return getpass.getuser()
    except Exception:
        return ""


def _pg_startup_refusal(sock: socket.socket, user: str, database: str, *,
                        timeout: float = _PROBE_TIMEOUT_S) -> str | None:
    """The SQLSTATE with which the server on ``sock`` refuses a session of ``user`` on
    ``database`` at startup, ``_PG_SILENT`` when it sends nothing at all within ``timeout``
    seconds, ``_PG_CLOSED`` when it closes the connection without sending a byte, else None (it
    asks for a password, or lets the session in: the probe then ends it, having learnt what it came
    for; or the peer does not speak the protocol).

    The code field of the server's ErrorResponse, which libpq keeps to itself when a connection
    fails; no message text is read. No password is sent, and no TLS is negotiated: the refusals
    looked for come before the server checks either."""
    params = b"".join(k.encode() + b"\0" + v.encode() + b"\0"
                      for k, v in (("user", user), ("database", database),
                                   ("application_name", "fencepost-diagnosis")))
    body = struct.pack("!i", _PG_PROTOCOL_3) + params + b"\0"
    # One bound for the whole exchange, not per read: a peer sending a byte now and then (a broken
    # proxy, something else listening on the port) would otherwise keep the probe for hours.
    deadline = time.monotonic() + timeout
    try:
        try:
            sock.sendall(struct.pack("!i", len(body) + 4) + body)
            sock.settimeout(timeout)
            first = sock.recv(1, socket.MSG_PEEK)
        except TimeoutError:
            return _PG_SILENT  # not one byte: nothing there is serving (a stopped server, a dead proxy)
        except (BrokenPipeError, ConnectionResetError):
            first = b""  # closed before (or while) our message reached it
        if not first:
            return _PG_CLOSED  # closed without a word
        if first[0] not in _PG_FIRST_KINDS:
            return _PG_FOREIGN  # another service's greeting or answer ("SSH-2.0-...", "HTTP/1.1 ...")
        try:
            kind, payload = _pg_message(sock, deadline)
        except _NotAMessage:
            return _PG_FOREIGN  # a first byte that fits, by chance, and a length no message has
        for _ in range(64):  # a login answers in a handful of messages
            if kind == b"E":
                return _pg_error_code(payload)
            if kind == b"Z" or (kind == b"R" and payload[:4] != b"\0\0\0\0"):
                return None  # ready for queries, or asked for a password: a slot was granted
            kind, payload = _pg_message(sock, deadline)
        return None
    except (OSError, struct.error, ValueError):
        return None
    finally:
        try:
            sock.settimeout(0.5)
            sock.sendall(b"X\0\0\0\x04")  # Terminate
        except OSError:
            pass


class _NotAMessage(ValueError):
    """What ``_pg_message`` raises for bytes that cannot begin a PostgreSQL protocol message."""


def _pg_message(sock: socket.socket, deadline: float) -> tuple[bytes, bytes]:
    """One backend message: its type byte and its payload (``ValueError`` for what is none,
    ``TimeoutError`` past the monotonic ``deadline``)."""
    head = _recv_exactly(sock, 5, deadline)
    (length,) = struct.unpack("!i", head[1:])
    if not 4 <= length <= 65536:
        raise _NotAMessage("not a PostgreSQL protocol message")
    return head[:1], _recv_exactly(sock, length - 4, deadline)


def _recv_exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the server did not answer in time")
        sock.settimeout(left)
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ValueError("the server closed the connection")
        data += chunk
    return data


def _pg_error_code(payload: bytes) -> str | None:
    """The SQLSTATE field (``C``) of an ErrorResponse's payload, when it is one."""
    for field in payload.split(b"\0"):
        if field[:1] == b"C" and _SQLSTATE.match(field[1:]):
            return field[1:].decode("ascii")
    return None


# Column types a JSON value carries exactly (a JSON string into text, a JSON integer into bigint).
_JSON_TYPES = frozenset({"TEXT", "BIGINT", "INTEGER"})
_encode_rows = msgspec.json.Encoder().encode


def _json_upsert_of(conn: Connection, table: Table, conflict: tuple[str, ...]) -> str | None:
    """``_json_upsert``, built once per table and conflict key."""
    return statement_cached(table, ("json_upsert", conflict), lambda: _json_upsert(conn, table, conflict))


def _json_row_type(table: Table) -> type:
    """A struct type encoding a tuple of ``table``'s columns as the JSON object of its columns."""
    names = [str(c.name) for c in table.columns]
    fields = [f"c{i}" for i in range(len(names))]
    return msgspec.defstruct("JsonRow", fields, rename=dict(zip(fields, names, strict=True)))


def _json_upsert(conn: Connection, table: Table, conflict: tuple[str, ...]) -> str | None:
    """The JSON bulk upsert's text, or None when a column's type is not carried exactly by JSON."""
    if any(c.type.compile(dialect=conn.dialect).upper() not in _JSON_TYPES for c in table.columns):
        return None
    prep = conn.dialect.identifier_preparer
    columns = ", ".join(prep.quote(c.name) for c in table.columns)
    updates = ", ".join(
        f"{prep.quote(c.name)} = EXCLUDED.{prep.quote(c.name)}" for c in table.columns if c.name not in conflict
    )
    keys = ", ".join(prep.quote(name) for name in conflict)
    # The table's own row type converts each member: the rows' keys are its column names.
    return (
        f"INSERT INTO {prep.format_table(table)} ({columns}) SELECT {columns} "
        f"FROM json_populate_recordset(NULL::{prep.format_table(table)}, %(rows)s::json) "
        f"ON CONFLICT ({keys}) DO UPDATE SET {updates}"
    )


def statement_cache(table: Table) -> dict[Any, Any]:
    """Statements built from ``table``, kept with it: tables of one name in two databases or
    schemas may have different columns, so a cache keyed by name could hand one the other's."""
    return table.info.setdefault("fencepost_statements", {})


_UNSET = object()


def statement_cached(table: Table, key: Any, make: Callable[[], Any]) -> Any:
    """``statement_cache(table)[key]``, made by ``make()`` the first time (None is kept as made)."""
    cache = statement_cache(table)
    value = cache.get(key, _UNSET)
    if value is _UNSET:
        value = cache[key] = make()
    return value


_BACKEND_CLASSES: dict[str, type[Backend]] = {"sqlite": SqliteBackend, "postgresql": PostgresBackend}


def backend_class(dialect_name: str) -> type[Backend]:
    """The Backend class for a SQLAlchemy dialect name (for statements compiled once per dialect)."""
    return _BACKEND_CLASSES[dialect_name]


# --------------------------------------------------------------------------- compiled constructs
# Module-level statements (runstore, consensus) are compiled once per dialect, before any Backend
# instance exists, so the few constructs they need that render differently are spelled here.


class greatest(FunctionElement):
    """``GREATEST(a, b)``; SQLite's two-argument ``max`` (both NULL-propagating on SQLite)."""

    inherit_cache = True
    name = "greatest"


@compiles(greatest)
def _greatest_default(element: greatest, compiler: Any, **kw: Any) -> str:
    return f"GREATEST({compiler.process(element.clauses, **kw)})"


@compiles(greatest, "sqlite")
def _greatest_sqlite(element: greatest, compiler: Any, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


class json_ids(ColumnElement[Any]):
    """The membership test against the JSON array text bound as ``:name`` (operator included).

    SQLite: ``IN (SELECT value FROM json_each(:name))``. PostgreSQL: ``= ANY(ARRAY(SELECT
    jsonb_array_elements_text(:name)))``, which the planner runs as an index probe per id on the
    primary key whatever its row estimates (an ``IN (SELECT ...)`` over a set-returning function can
    be planned as a nested loop that is quadratic in the number of ids).
    """

    inherit_cache = True
    type = NullType()
    _traverse_internals: list[Any] = []

    def __init__(self, name: str) -> None:
        self.param = bindparam(name, type_=Text)


@compiles(json_ids)
def _json_ids_pg(element: json_ids, compiler: Any, **kw: Any) -> str:
    p = compiler.process(element.param, **kw)
    return f"= ANY(ARRAY(SELECT jsonb_array_elements_text(CAST({p} AS JSONB))))"


@compiles(json_ids, "sqlite")
def _json_ids_sqlite(element: json_ids, compiler: Any, **kw: Any) -> str:
    return f"IN (SELECT value FROM json_each({compiler.process(element.param, **kw)}))"


def in_json_ids(column: Any, name: str) -> Any:
    """``column`` is one of the ids of the JSON array bound as ``:name`` (one parameter for any count)."""
    return column.op("", is_comparison=True)(json_ids(name))


def _strip_comments(sql: str) -> str:
    return "\n".join(line for line in sql.splitlines() if not line.strip().startswith("--")).strip()
