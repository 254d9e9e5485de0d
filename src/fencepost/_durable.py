"""The durable writer: one serialized write transaction per call, snapshot reads, retries.

Contract (REFERENCE 1.2, seed compose-the-stores): two write transactions can never both commit
from snapshots that exclude each other's writes. SQLite gets there with ``BEGIN IMMEDIATE``;
PostgreSQL with a per-schema ``pg_advisory_xact_lock`` taken first. A nested ``write`` joins the
outer transaction as a savepoint. A transient failure (busy, serialization, deadlock, lost
connection) retries the whole outermost callable; driver errors are classified by code, never by
message text, and surface without SQL text or bound values.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast
from urllib.parse import quote

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from fencepost._dialects import (
    BUSY_TIMEOUT_MS,
    PG_CONNECT_TIMEOUT_S,
    SQLITE_CHECKPOINTS,
    SQLITE_SYNCHRONOUS,
    Backend,
    PostgresBackend,
    SqliteBackend,
    pg_connect_timeout,
    readonly_uri,
    schema_problem,
    unused_state,
)
from fencepost._group import GroupCommit, aborted, aborted_failure, own_call_in_progress
from fencepost._statements import wrapped
from fencepost._txn import PROCESS
from fencepost._txn import Txn as _Txn
from fencepost._txn import current as _current
from fencepost._values import ascii_digits, text_problem
from fencepost.errors import DatabaseMissing, FencepostError, OpenError, PersistenceError

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

DEFAULT_URL = "sqlite:///.flows/flows.db"
DEFAULT_SCHEMA = "fencepost"
MAX_ATTEMPTS = 12
# Connections per store: POOL_SIZE kept open in the pool, up to POOL_OVERFLOW more while in use
# (together the default of the URL option ``pool_size``). Threads keep theirs between calls, but an
# idle thread's connection is taken back when the pool runs dry, so the limit bounds transactions in
# progress, not threads.
POOL_SIZE = 8
POOL_OVERFLOW = 24
POOL_SIZE_MAX = 1000  # the most ``pool_size`` may ask for
POOL_WAIT = 30.0  # seconds a call waits for a connection when every one is inside a transaction


class DbFailure(Exception):
    """A database failure, value-free: ``category`` is ``constraint``, ``persistence_failed``, or
    ``decode_failed`` (a stored value the driver cannot decode: SQLite TEXT that is not UTF-8)."""

    def __init__(self, category: str, code: str | None, reason: str | None = None, *,
                 reconnect: bool = False, transient: bool = False) -> None:
        self.category = category
        self.code = code
        self.reason = reason  # why, when fencepost knows it without the driver ("the store is closed")
        # The connection was stale (its file replaced) and has been dropped: the call may start over
        # on a new one, as for a transient failure, and at once.
        self.reconnect = reconnect
        # The database was unavailable or busy (a lost connection, a server not accepting, a lock
        # held past the wait): the same call may succeed once it answers again.
        self.transient = transient
        super().__init__(f"{category} ({code or 'no code'})")


# Marks a driver error raised while making a new connection (``Database._checkout``).
_CONNECTING = "fencepost_connecting"
# Marks (in the pool record's ``record_info``) a connection taken back and counted as releasing
# until the pool has it back (``Database._returned``).
_RETURNING = "fencepost_returning"


class ConnectProblem(NamedTuple):
    """Why connecting failed: an ``OpenError`` code (``cannot_connect``, ``auth_failed``,
    ``database_missing`` ...), the driver's code, a value-free sentence the diagnosis adds (the URL
    options a failure depends on, another writer's lock), and whether waiting may cure it."""

    problem: str
    code: str | None
    note: str | None
    transient: bool


def failure_detail(subject: str, exc: DbFailure) -> str:
    """``"<subject> persistence failed"``, with the reason when fencepost knows it (for a stored
    value that cannot be decoded, ``"<subject>: <what cannot be decoded>"``)."""
    if exc.category == DECODE_FAILED:
        return f"{subject}: {exc.reason or 'a stored value cannot be decoded'}"
    return f"{subject} persistence failed" + (f": {exc.reason}" if exc.reason else "")


DECODE_FAILED = "decode_failed"


def failure_code(exc: DbFailure, usual: str, closed: str | None = None) -> str:
    """The code of the store error for ``exc``: ``decode_failed`` for a stored value that cannot
    be decoded (the code every component gives a corrupt stored row); ``closed``, when given, for a
    store that was closed (a part with a code of its own for that: the journal's ``journal_closed``);
    else ``usual``."""
    if exc.category == DECODE_FAILED:
        return DECODE_FAILED
    return closed if closed is not None and store_closed(exc) else usual


# The reason of a COMMIT that got no answer: nothing may repeat it blindly (see CommitUnknown).
COMMIT_UNKNOWN = ("COMMIT got no definite answer (the connection or the disk failed), so the write "
                  "may have committed: check before repeating it")


def _read_only() -> DbFailure:
    return DbFailure("persistence_failed", "read_only", "the store is open read-only")


def _closed() -> DbFailure:
    # A new exception each time: one shared instance would gather every raise's traceback.
    return DbFailure("persistence_failed", "closed", "the store is closed")


def store_closed(exc: BaseException) -> bool:
    """Whether ``exc`` (a ``DbFailure``, or the store error it was mapped to) says the store is
    closed: a failure that never goes away, so no caller retries it."""
    code = exc.code if isinstance(exc, DbFailure) else getattr(exc, "db_code", None)
    return code == "closed"


class CommitUnknown(Exception):
    """The connection failed during COMMIT: the transaction may or may not have committed."""

    def __init__(self, failure: DbFailure) -> None:
        self.failure = failure
        super().__init__("commit outcome unknown")


def _guard(conn: Connection) -> None:
    """Make ``commit()``, ``rollback()`` and ``close()`` on a kept connection raise: the connection
    is handed to callbacks inside fencepost's transaction, which fencepost alone ends (committing
    the callback's work with the write lock still held and, for a projection, with its checkpoint).
    A callback's COMMIT would have committed part of its work on the spot and left SQLAlchemy's
    next transaction on the connection, failing every later call. fencepost ends its transactions
    through the ``Transaction`` it began, never through these methods."""
    for method in ("commit", "rollback", "close"):
        setattr(conn, method, functools.partial(_refuse_ending, method))


def _refuse_ending(method: str) -> None:
    raise DbFailure("persistence_failed", None,
                    f"the callback called conn.{method}(): fencepost ends the transaction it hands a callback "
                    f"once the callback returns, so it cannot be ended inside it; nothing of it was committed")


class _Slot:
    """One kept connection; released when its thread ends (the slot is collected) or on dispose.

    ``lock`` is held by the owning thread for the length of each transaction, so ``dispose`` never
    closes a connection under a transaction another thread has open (that orphaned the transaction
    and, on SQLite, its write lock); a busy slot is closed when its transaction ends instead.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        # The thread inside ``lock`` (its id), so that the same thread asking again (a signal
        # handler or finalizer that ran while its transaction began or committed) is refused at
        # once instead of waiting for itself.
        self.holder: int | None = None
        # Taken back (``claim_if_idle``): never used again, though its release may still be under way.
        self.reclaimed = False
        self._finalizer = weakref.finalize(self, _close_quietly, conn, os.getpid())

    def release(self) -> None:
        self._finalizer()

    def claim_if_idle(self, transaction_open: Callable[[Any], bool] | None = None) -> bool:
        """Take the slot back unless it is provably in use; True when taken. The caller releases it.

        In use: its thread holds ``lock`` (a transaction is running on it), or a transaction is
        open on it all the same (SQLAlchemy's, or the driver's when ``transaction_open`` asks the
        driver connection): closing that would end a transaction under whoever opened it. Once
        taken, its thread finds it reclaimed under ``lock`` and never begins on it, so the release
        (on PostgreSQL a rollback over the network) can run without holding any lock.
        """
        if not self.lock.acquire(blocking=False):
            return False
        try:
            conn = self.conn
            if not conn.closed and not conn.invalidated:
                if conn.in_transaction():
                    return False
                if transaction_open is not None and transaction_open(conn.connection.dbapi_connection):
                    return False
            self.reclaimed = True
        finally:
            self.lock.release()
        return True

    def release_if_idle(self, transaction_open: Callable[[Any], bool] | None = None) -> bool:
        """Close the connection now (back to the pool) unless it is provably in use; True when closed."""
        if not self.claim_if_idle(transaction_open):
            return False
        self.release()
        return True


# Connections a forked child inherited from its parent: kept referenced and never used, closed or
# rolled back in the child, because they are the parent's live sessions (a rollback sent from the
# child would silently undo a transaction the parent is about to commit).
_INHERITED: list[Connection] = []


def _abandon_inherited(conn: Connection) -> None:
    try:
        dbapi = conn.connection.dbapi_connection
        fileno = getattr(dbapi, "fileno", None)
        if fileno is not None:
            # A PostgreSQL socket: point the child's copy of the descriptor at /dev/null, so not
            # even a reset at interpreter exit can reach the parent's server session.
            devnull = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(devnull, fileno())
            finally:
                os.close(devnull)
    except Exception:  # nothing to neutralize (already closed or invalidated)
        pass
    _INHERITED.append(conn)


def _close_quietly(conn: Connection, pid: int) -> None:
    if os.getpid() != pid:
        _abandon_inherited(conn)
        return
    try:
        Connection.close(conn)  # the class's own: ``_guard`` refuses ``conn.close()`` to callbacks
    except Exception:  # a connection already broken has nothing left to release
        pass


ENV_SOURCE = "$FENCEPOST_DB"
"""How an error names a URL taken from the environment (the CLI's ``--db`` checks say the same)."""


def from_environment(url: str | None) -> bool:
    """Whether ``resolve_url(url)`` takes the URL from ``$FENCEPOST_DB``."""
    return not url and bool(os.environ.get("FENCEPOST_DB"))


def resolve_url(url: str | None) -> str:
    """``url``, else ``$FENCEPOST_DB``, else the embedded default ``sqlite:///.flows/flows.db``."""
    return url or os.environ.get("FENCEPOST_DB") or DEFAULT_URL


def connect_wait_s(url: str) -> float:
    """How long a connection to the database at ``url`` may wait for it, in seconds: a PostgreSQL
    URL's ``connect_timeout`` (else fencepost's default), a SQLite URL's ``busy_timeout_ms``."""
    parsed, options = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        return int(options.get("busy_timeout_ms", BUSY_TIMEOUT_MS)) / 1000
    return pg_connect_timeout(dict(parsed.query))


def redact_url(url: str) -> str:
    """The URL with any password hidden, safe to print: the one in the authority, any query
    option that carries a secret (``?password=``, ``?sslpassword=``, ...), and any option whose value
    holds a credential by the journal's textual rules (``?options=-c app.api_token=...``). A database path holding
    bytes that are not UTF-8 (a SQLite file name may) shows them percent-encoded (``%FF``), as the
    URL shows every byte of a non-ASCII path."""
    try:
        parsed = _password_to_last_at(make_url(url))
        query = {k: (_MASK if _secret_option(k, v) else v) for k, v in parsed.query.items()}
        database = parsed.database
        undecodable = database is not None and text_problem(database) is not None
        if undecodable:  # the renderer's quoting refuses lone surrogates: quote the path here
            parsed = parsed.set(database=_PATH_MARK)
        shown = parsed.set(query=query).render_as_string(hide_password=True)
        if undecodable and database is not None:
            shown = shown.replace(_PATH_MARK_ESCAPED, quote(database, safe=" +/", errors="surrogateescape"))
    except Exception:
        return "<unparseable database URL>"
    return shown.replace(_MASK_ESCAPED, "***")


def _password_to_last_at(parsed: URL) -> URL:
    """``parsed`` with the authority's password running to its last ``@``: the parser splits at the
    first, so a raw ``@`` in a password (``app:p4ss@word@db``) would show the rest of it as the host.
    ``parse_url`` refuses such a URL; this is for showing one."""
    host = parsed.host
    if host is None or "@" not in host:
        return parsed
    return parsed.set(password=_MASK, host=host.rpartition("@")[2])


def holds_secret(url: str) -> bool:
    """Whether the URL carries a credential ``redact_url`` would hide: a password in its authority,
    a query option that carries a secret (``?password=``), or an option value holding one."""
    try:
        parsed = make_url(url)
    except Exception:
        return False
    return bool(parsed.password) or any(_secret_option(k, v) for k, v in parsed.query.items())


# A query value stands in for a masked secret; rendered URL-escaped, then shown as ``***``.
_MASK = "\x00masked\x00"
_MASK_ESCAPED = "%00masked%00"
# Stands in for a database path the renderer cannot quote (it holds bytes that are not UTF-8).
_PATH_MARK = "\x00database\x00"
_PATH_MARK_ESCAPED = "%00database%00"
_SECRET_WORDS = ("password", "secret", "token", "key")


def _secret_value(value: str | tuple[str, ...]) -> bool:
    """Whether an option's value (each of them, when given more than once) holds a credential that
    the journal's textual redaction would rewrite: libpq's ``options`` carries ``-c name=value``
    settings, and a ``name`` such as ``app.api_token`` makes its value a secret."""
    from fencepost.journal.redaction import DEFAULT

    return any(DEFAULT.text(v) != v for v in ((value,) if isinstance(value, str) else value))


def _secret_option(key: str, value: str | tuple[str, ...]) -> bool:
    """Whether a query option carries a secret: by its name (``?password=``, ``?sslpassword=``) or
    by a credential in its value (``_secret_value``). What ``redact_url`` hides, ``holds_secret`` finds."""
    low = key.lower()
    return any(word in low for word in _SECRET_WORDS) or _secret_value(value)


#: fencepost's own URL options, by the backend they apply to (``any``: both).
_OWN_OPTIONS = {"schema": "postgresql", "synchronous": "sqlite", "busy_timeout_ms": "any", "checkpoints": "sqlite",
                "pool_size": "any"}
# SQLite's busy timeout and PostgreSQL's lock_timeout are C ints: past this, SQLite's wraps to no wait.
_BUSY_TIMEOUT_MAX = 2**31 - 1
_NAMEABLE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def _driver_options() -> frozenset[str] | None:
    """The connection keywords libpq accepts, or None when the driver is not installed."""
    global _LIBPQ_KEYWORDS
    if _LIBPQ_KEYWORDS is None:
        try:
            from psycopg import pq
        except ImportError:
            return None
        _LIBPQ_KEYWORDS = frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())
    return _LIBPQ_KEYWORDS


_LIBPQ_KEYWORDS: frozenset[str] | None = None


def parse_url(url: str) -> tuple[URL, dict[str, str]]:
    """The driver URL (fencepost's own options taken out) and those options, checked.

    ``ValueError`` names the rule a URL breaks, never the URL (it may hold a password). Nothing is
    created or connected: ``Database`` checks here before it makes a SQLite file's directory.
    """
    # The driver's own parse errors quote the URL (credentials included): name the rule only.
    # Raised outside the ``except`` so the quoting exception is not even kept as ``__context__``.
    parsed = None
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - parsed lazily; a non-numeric port fails here, quoting itself
    except Exception:
        parsed = None
    if parsed is None:
        raise ValueError("database URL could not be parsed" + ("" if _SCHEME.match(url) else _NO_SCHEME))
    if parsed.host is not None and "@" in parsed.host:
        # ``app:p4ss@word@db``: the parser splits at the first ``@``, so the rest of the password
        # would be taken for the host name (and be shown and looked up as one).
        raise ValueError("the URL's password holds a raw '@': write an '@' in a user name or "
                         "password as %40")
    if parsed.drivername.partition("+")[0] == "postgres":
        # The scheme hosting platforms hand out (DATABASE_URL=postgres://...): PostgreSQL's own alias.
        parsed = parsed.set(drivername="postgresql+psycopg")
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ValueError("unsupported database URL scheme (use sqlite:/// or postgresql://)")
    if backend == "sqlite" and (parsed.host or parsed.username or parsed.password or parsed.port is not None):
        # ``sqlite://flows.db``: two slashes make the file name a host (and the URL an in-memory
        # database); with a path after it, SQLAlchemy refuses it later in several lines.
        raise ValueError("a SQLite URL has no host: the file comes after three slashes, "
                         "sqlite:///relative/path.db or sqlite:////absolute/path.db")
    if backend == "postgresql" and parsed.port is not None and not 1 <= parsed.port <= 65535:
        # libpq refuses it at connect time as a connection failure, which waiters retry forever.
        raise ValueError("port must be an integer in 1..65535 (the URL's host:port)")
    problem = text_problem(url) if backend == "postgresql" else None
    if problem:
        # libpq takes the connection string as UTF-8: encoding it fails in the driver with an error
        # that holds the whole string, password included. (A SQLite URL names a file, whose name
        # may hold any bytes: Python opens it as given.)
        why = "holds bytes that are not UTF-8" if "surrogate" in problem else problem
        raise ValueError(f"a PostgreSQL URL must be UTF-8 text: it {why}")
    _refuse_nul(parsed, backend)
    query = dict(parsed.query)
    # The URL parser drops an option given with no value (``?schema=``): it would silently mean the
    # default, so fencepost's own options are looked for in the raw query string too.
    # Read as SQLAlchemy reads it: a '#' is text like any other, not the start of a fragment.
    raw_query = url.partition("?")[2]
    if backend == "sqlite" and "#" in raw_query:
        # ``runs?#2026.db``: the parser would open the file ``runs`` and take the rest for options.
        raise ValueError("the URL's options (after '?') hold a '#'; a '?' or '#' in a SQLite "
                         "file's path is written %3F or %23")
    for pair in raw_query.split("&"):
        key, equals, value = pair.partition("=")
        if pair and not equals:
            # The URL parser drops it without a word; in a SQLite URL it is most often the rest of a
            # file name holding a '?', and the store would be made at the path cut short there.
            raise ValueError("the URL's options (after '?') hold text that is not name=value; "
                             "a '?' in a SQLite file's path is written %3F")
        if key in _OWN_OPTIONS and value == "":
            raise ValueError(f"{key} is given without a value")
    for key, given in query.items():
        applies = _OWN_OPTIONS.get(key)
        if applies is None:
            continue  # the driver's: given twice, refused below unless libpq takes it so (``host``)
        if not isinstance(given, str):
            raise ValueError(f"{key} is given more than once")
        if applies not in (backend, "any"):
            raise ValueError(f"{key} applies to {'SQLite' if applies == 'sqlite' else 'PostgreSQL'} URLs only")
    # One string each: an option given more than once was refused above.
    options = {k: cast(str, query.pop(k)) for k in _OWN_OPTIONS if k in query}
    allowed = None if backend == "sqlite" else _driver_options()  # None: no driver to ask (refused later)
    unknown = [k for k in query if backend == "sqlite" or (allowed is not None and k not in allowed)]
    if unknown:
        known = ", ".join(k for k, b in _OWN_OPTIONS.items() if b in (backend, "any"))
        more = "" if backend == "sqlite" else " and the driver's connection keywords"
        key = unknown[0]
        name = _option_name(key)
        if name is None:
            # Not shown as given (it may be a value put where a name goes), but a known name written
            # in capitals is named in lowercase: the only way to tell what is wrong with it.
            lower = key.lower()
            name = (f"'{lower}' written with capitals (option names are lowercase)"
                    if lower in _OWN_OPTIONS or (allowed is not None and lower in allowed)
                    else "whose name is not shown (it does not look like an option name)")
        raise ValueError(f"unknown URL option {name} (known: {known}{more})")
    if backend == "postgresql":
        _refuse_repeated_driver_options(query)
        _refuse_ipv6_host_option(query)
        _check_libpq_numbers(query)
        _check_libpq_choices(query)
        _check_hosts_and_ports(query, parsed.port)
        _refuse_search_path(query)
        _refuse_client_encoding(query)
    timeout = options.get("busy_timeout_ms", "0")
    if not (ascii_digits(timeout) and int(timeout) <= _BUSY_TIMEOUT_MAX):
        raise ValueError(f"busy_timeout_ms must be an integer of milliseconds in 0..{_BUSY_TIMEOUT_MAX}")
    size = options.get("pool_size", "1")
    if not (ascii_digits(size, 4) and 1 <= int(size) <= POOL_SIZE_MAX):
        raise ValueError(f"pool_size must be an integer number of connections in 1..{POOL_SIZE_MAX}")
    if options.get("synchronous", "FULL").upper() not in SQLITE_SYNCHRONOUS:
        raise ValueError("synchronous must be one of OFF, NORMAL, FULL, EXTRA")
    if options.get("checkpoints", "background") not in SQLITE_CHECKPOINTS:
        raise ValueError("checkpoints must be background or writer")
    problem = schema_problem(options.get("schema", DEFAULT_SCHEMA))
    if problem is not None:
        raise ValueError(problem)
    database = parsed.database or ""
    if backend == "sqlite" and database in ("", ":memory:"):
        raise ValueError("an in-memory SQLite URL cannot be shared; use fencepost.testing")
    if backend == "sqlite" and database.endswith("/"):
        # The path would lose its slash and the store become a file named like the directory.
        raise ValueError("a SQLite URL names the database file, not a directory: end it with the "
                         "file's name (sqlite:///dir/flows.db)")
    return parsed.set(query=query), options


def _refuse_nul(parsed: URL, backend: str) -> None:
    """Refuse a NUL (``%00`` once the URL is decoded) in any part of the URL, naming the part.

    No file name can hold one (Python says only "embedded null byte"), and libpq ends its
    connection string there, so the rest of it (the user, the database ...) would be silently lost.
    """
    parts = [("path" if backend == "sqlite" else "database", parsed.database), ("user", parsed.username),
             ("password", parsed.password), ("host", parsed.host)]
    for key, given in parsed.query.items():
        part = f"option {_option_name(key) or '(its name not shown)'}"
        parts.append((part, key))
        parts.extend((part, value) for value in _values(given))
    for part, value in parts:
        if isinstance(value, str) and "\x00" in value:
            raise ValueError(f"the URL's {part} holds a NUL character (%00), which no "
                             f"{'file name' if backend == 'sqlite' else 'PostgreSQL connection'} can hold")


# A URL starts with ``scheme://``; a value without it is most often a plain file path (``--db
# /data/flows.db``), which is refused rather than guessed at (see docs/decisions.md), with the form to use.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_NO_SCHEME = (": it has no scheme (a SQLite file is given as sqlite:///relative/path.db or "
              "sqlite:////absolute/path.db, PostgreSQL as postgresql://user@host/database)")


def _refuse_search_path(query: dict[str, Any]) -> None:
    """Refuse libpq ``options`` that set ``search_path`` (``-csearch_path=app``, ``--search-path=app``):
    the usual way to choose a schema elsewhere, but fencepost sets the search path to the store's
    schema on every connection, so the store would silently land in another schema. Only a switch
    whose setting NAME is ``search_path`` is refused (``-c application_name=search-path-svc`` is not);
    see ``_pg_option_settings``. PostgreSQL only."""
    if _options_set(query, "search_path"):
        raise ValueError("the options option sets search_path, which fencepost sets itself to the store's "
                         "schema: name the schema with ?schema=NAME instead")


def _refuse_client_encoding(query: dict[str, Any]) -> None:
    """Refuse a URL asking for a client encoding other than UTF8 (``?client_encoding=LATIN1``, or
    ``options=-c client_encoding=SQL_ASCII``): fencepost's connections always talk UTF8 (run ids and
    states are any Unicode text; a SQL_ASCII session hands text back as bytes). Named, never its
    value. PostgreSQL only."""
    if any(not _utf8_name(v) for v in _values(query.get("client_encoding"))):
        raise ValueError("client_encoding asks for a client encoding other than UTF8, and fencepost's "
                         "connections always use UTF8: leave the option out")
    if any(not _utf8_name(value) for v in _values(query.get("options"))
           for name, value in _pg_option_pairs(v) if name.isascii() and name.lower() == "client_encoding"):
        raise ValueError("the options option sets client_encoding to an encoding other than UTF8, and "
                         "fencepost's connections always use UTF8: leave that setting out")


def _utf8_name(value: str) -> bool:
    """Whether ``value`` names UTF8 as PostgreSQL reads an encoding's name (letters and digits only,
    any case: ``utf8``, ``UTF-8``, ``unicode``)."""
    return "".join(c for c in value.lower() if c.isascii() and c.isalnum()) in ("utf8", "unicode")


def _options_set(query: Mapping[str, Any], setting: str) -> bool:
    """Whether the URL's libpq ``options`` set ``setting`` (a lower-case name; see ``_pg_option_settings``)."""
    return any(name.isascii() and name.lower() == setting
               for v in _values(query.get("options")) for name in _pg_option_settings(v))


def pg_session_name(query: Mapping[str, Any], default: str) -> dict[str, str]:
    """The connection keyword that names fencepost's PostgreSQL sessions ``default`` where the user
    names them nowhere. Given as libpq's ``fallback_application_name``, so the URL's own
    ``application_name`` and ``PGAPPNAME`` win over it, as libpq orders them; left out when the URL's
    ``options`` sets ``application_name`` (any keyword naming the session, a fallback included,
    would override that setting) or the URL gives its own fallback. fencepost looks none of its
    sessions up by name: the name is for people reading ``pg_stat_activity`` and the server's logs."""
    if "fallback_application_name" in query or _options_set(query, "application_name"):
        return {}
    return {"fallback_application_name": default}


# The server's switches (its getopt string) that take an argument; of these, ``-c NAME=VALUE`` and
# ``--NAME=VALUE`` set a setting by name. Its other letters are flags (``-e``, ``-s`` ...) or refused.
_PG_WITH_ARGUMENT = frozenset("BcCDdfhkNprStvW-")
_C_SPACE = " \t\n\v\f\r"


def _pg_split_options(text: str) -> list[str]:
    """Split a libpq ``options`` value as the server does: at runs of whitespace, a backslash
    taking the next character literally (``\\ `` a space inside a word, ``\\\\`` a backslash)."""
    words: list[str] = []
    word: list[str] = []
    started = escaped = False
    for ch in text:
        if escaped:
            word.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = started = True
        elif ch in _C_SPACE:
            if started:
                words.append("".join(word))
                word, started = [], False
        else:
            word.append(ch)
            started = True
    if started:
        words.append("".join(word))
    return words


def _pg_option_settings(text: str) -> list[str]:
    """The setting names a libpq ``options`` value sets, read as the server reads its switches
    (POSIX getopt): ``-c NAME=VALUE``, ``-cNAME=VALUE`` and ``--NAME=VALUE``, after any flags grouped
    before them (``-ec NAME=VALUE``); another switch's argument is never a name; ``--`` alone ends
    the switches. Each NAME has ``-`` made ``_``, as the server makes it."""
    return [name for name, _ in _pg_option_pairs(text)]


def _pg_option_pairs(text: str) -> list[tuple[str, str]]:
    """``_pg_option_settings`` with each setting's value: ``(NAME, VALUE)`` pairs."""
    words = _pg_split_options(text)
    names: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            break
        if len(word) < 2 or not word.startswith("-"):
            continue  # not a switch (the server refuses it)
        j = 1
        while j < len(word):
            flag = word[j]
            j += 1
            if flag not in _PG_WITH_ARGUMENT:
                continue  # a flag, or a letter the server refuses
            if j < len(word):
                argument = word[j:]
            elif i < len(words):
                argument = words[i]
                i += 1
            else:
                break  # a switch without its argument (the server refuses it)
            if flag in "c-":
                name, _, value = argument.partition("=")
                names.append((name.replace("-", "_"), value))
            break
    return names


# libpq's options that take a whole number (a C int): a value that is not one failed only when
# libpq came to connect, as ``open_failed``, where every other bad option is refused by name here.
_LIBPQ_NUMBERS = {"connect_timeout": "an integer of seconds", "keepalives": "an integer (0 turns keepalives off)",
                  "keepalives_idle": "an integer of seconds", "keepalives_interval": "an integer of seconds",
                  "keepalives_count": "an integer", "tcp_user_timeout": "an integer of milliseconds"}
_INT_MAX = 2**31 - 1


def _check_libpq_numbers(query: dict[str, Any]) -> None:
    """Refuse a libpq numeric option (or a ``port`` in the query) that is not a number, by name."""
    for key, what in _LIBPQ_NUMBERS.items():
        for value in _values(query.get(key)):
            digits = value[1:] if value.startswith("-") else value
            if not (ascii_digits(digits, 10) and int(digits) <= _INT_MAX):
                raise ValueError(f"{key} must be {what} in -{_INT_MAX}..{_INT_MAX}")
    for value in _values(query.get("port")):
        # One port, or one per host (``host=a,b&port=5432,5433``).
        if not all(ascii_digits(p, 5) and 1 <= int(p) <= 65535 for p in value.split(",")):
            raise ValueError("port must be an integer in 1..65535 (with several hosts, one per host, "
                             "separated by commas)")
    for port in _ports_in_hosts(query):
        # SQLAlchemy's other spelling, ``host=h:p`` (once, or once per host): libpq would be handed a
        # port no server has, a transient ``cannot_connect`` that the worker and console wait on.
        if port and not (ascii_digits(port, 5) and 1 <= int(port) <= 65535):
            raise ValueError("port must be an integer in 1..65535 (the URL's host=HOST:PORT option)")


# libpq's options that take one of a few words (compared case-sensitively, as libpq does): any
# other value failed only when libpq came to connect, as ``open_failed`` after a connection attempt.
_LIBPQ_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "sslnegotiation": ("postgres", "direct"),
    "sslcertmode": ("disable", "allow", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
}


def _check_libpq_choices(query: dict[str, Any]) -> None:
    """Refuse a libpq option that takes one of a few words when it is given another, by name (the
    value is never repeated: it may have been meant for another option, a password say)."""
    for key, words in _LIBPQ_CHOICES.items():
        if any(value not in words for value in _values(query.get(key))):
            raise ValueError(f"{key} must be one of {', '.join(words)}")


# The libpq keywords the PostgreSQL dialect hands over as one list when given more than once:
# several ``host`` options (joined with commas), and ``port`` (beside one ``host`` option naming as
# many hosts; ``_check_hosts_and_ports``). Any other reaches libpq as the text of a Python tuple.
_DRIVER_LISTS = frozenset({"host", "port"})


def _refuse_repeated_driver_options(query: dict[str, Any]) -> None:
    """Refuse a libpq keyword given more than once that the driver does not take as a list
    (``?sslmode=disable&sslmode=require``): libpq would be handed ``"('disable', 'require')"``,
    refused at connect time as ``open_failed`` or, for a free-text keyword such as
    ``application_name``, taken as that text. Named as fencepost's own options are, never the value."""
    for key, given in query.items():
        if not isinstance(given, str) and key not in _DRIVER_LISTS:
            raise ValueError(f"{key if _NAMEABLE.match(key) else 'an option'} is given more than once")


def _refuse_ipv6_host_option(query: dict[str, Any]) -> None:
    """Refuse an IPv6 address the PostgreSQL dialect would cut up: one among several ``host``
    options (each is split at every colon, so ``host=::1&host=h:p`` hands libpq an empty first
    host, the default Unix socket, and the store connects there silently), or one in brackets
    (handed over as a host name no resolver knows). A socket directory (``/...``) is no address."""
    hosts = _values(query.get("host"))
    if any(not h.startswith("/") and ("[" in h or "]" in h or (len(hosts) > 1 and h.count(":") > 1))
           for h in hosts):
        raise ValueError("an IPv6 address in a host option is given without brackets, and not as one of "
                         "several host options (their values are split at every colon): name several hosts "
                         "in one option and their ports in another, host=H1,H2&port=P1,P2")


# The one ``host`` option SQLAlchemy reads as ``host:port`` (a name or an IPv4 address, digits after it).
_HOST_AND_PORT = re.compile(r"^[a-zA-Z0-9\-.]*:(\d*)$")
# What reads as ``name:port`` to a person but not to SQLAlchemy: any name without a slash (a socket
# directory) or a second colon (an IPv6 address), such as a container's ``my_db:5432``.
_LOOKS_LIKE_HOST_AND_PORT = re.compile(r"^[^/:,]+:\d*$")


def _ports_in_hosts(query: dict[str, Any]) -> list[str]:
    """The ports the PostgreSQL dialect takes from ``host`` options, as it splits them: from every
    ``host=h:p`` given more than once; from a single ``host=h:p`` given without ``port``."""
    hosts = _values(query.get("host"))
    if len(hosts) > 1:
        return [parts[1] for parts in (h.split(":") for h in hosts) if len(parts) == 2]
    if len(hosts) == 1 and "port" not in query:
        found = _HOST_AND_PORT.match(hosts[0])
        return [found.group(1)] if found else []
    return []


_ONE_WAY = "each in its host option (host=H1:P1&host=H2:P2) or all in the port option (host=H1,H2&port=P1,P2)"


def _check_hosts_and_ports(query: dict[str, Any], authority_port: int | None) -> None:
    """Refuse hosts and ports given in ways the PostgreSQL dialect cannot put together, each with
    one line saying how to give them, where it would raise its own multi-line ``ArgumentError``,
    hand libpq a host named ``name:port`` (a transient ``cannot_connect`` waited on for ever), or
    silently drop the URL's own port. The dialect takes the ports of several hosts either from
    each ``host=name:port`` option or from ``port`` beside one ``host`` option naming the hosts
    (``host=h1,h2&port=p1,p2``), not both; a single ``host=name:port`` only without ``port``.
    Numbers are checked before (``_check_libpq_numbers``); an IPv6 address has two colons or more,
    so it is never taken for ``name:port`` here."""
    hosts, ports = _values(query.get("host")), _values(query.get("port"))
    if len(hosts) > 1:
        if ports:
            raise ValueError(f"several host options and a port option: give the ports one way only, {_ONE_WAY}")
        if any("," in h for h in hosts):
            raise ValueError("several host options name one host each (host=H1:P1&host=H2:P2); "
                             "or name all the hosts in one (host=H1,H2)")
        # Several hosts, one of which has no port of its own.
        unported = any(h.count(":") != 1 or not h.split(":")[1] for h in hosts)
    else:
        names = hosts[0].split(",") if hosts else [""]
        if len(names) == 1 and not ports and _LOOKS_LIKE_HOST_AND_PORT.match(names[0]) \
                and not _HOST_AND_PORT.match(names[0]):
            # SQLAlchemy splits a single host:port only for names of letters, digits, '-' and '.':
            # libpq would be handed the host name "my_db:5432", which resolves nowhere.
            raise ValueError("a host option written HOST:PORT whose name holds characters other than letters, "
                             "digits, '-' and '.': give the port in the port option (host=HOST&port=PORT)")
        if len(names) > 1 and any(_LOOKS_LIKE_HOST_AND_PORT.match(n) for n in names):
            raise ValueError("a host option naming several hosts holds a HOST:PORT; give the ports "
                             "in the port option, one per host (host=H1,H2&port=P1,P2)")
        if len(names) == 1 and hosts and ports and _LOOKS_LIKE_HOST_AND_PORT.match(names[0]):
            raise ValueError("a host option written HOST:PORT beside a port option: give the port one way "
                             "only (host=HOST&port=PORT or host=HOST:PORT)")
        if len(ports) > 1 and any("," in p for p in ports):
            raise ValueError("port is given more than once with several ports in one: give one port each, "
                             "or all of them in one port option (port=P1,P2)")
        given = list(ports) if len(ports) > 1 else ports[0].split(",") if ports else []
        if given and len(given) != len(names) and (len(names) > 1 or len(given) > 1):
            n, m = len(names), len(given)
            raise ValueError(f"{n} host{'s' * (n > 1)} and {m} port{'s' * (m > 1)}: give one port per host, "
                             "in the order of the hosts (host=H1,H2&port=P1,P2)")
        unported = len(names) > 1 and not ports
    if authority_port is not None and unported:
        raise ValueError("the URL's host:port gives a port that several hosts in host options would not "
                         f"use: give their ports {_ONE_WAY}")


def _values(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    return () if value is None else (value,) if isinstance(value, str) else tuple(value)


def _option_name(key: str) -> str | None:
    """A query option's name for an error: quoted when it looks like a name, else None: not shown
    (a mangled URL may have put a value where the name goes)."""
    return f"'{key}'" if _NAMEABLE.match(key) else None


# What ``watching_engines`` asked to be told on this thread: each engine a ``Database`` builds.
_watchers = threading.local()


@contextlib.contextmanager
def watching_engines(built: Callable[[Engine], None]) -> Iterator[None]:
    """Within the block, call ``built`` with every engine a ``Database`` builds on this thread,
    before that engine makes its first connection (so its own ``connect`` listeners see every one).

    How the console's open attempts learn that they reached their database without listening to
    every SQLAlchemy pool of the process (an embedding application's included).
    """
    outer = getattr(_watchers, "built", None)
    _watchers.built = built
    try:
        yield
    finally:
        _watchers.built = outer


def _read_schema(conn: Connection) -> None:
    """One read of a SQLite database's schema table: it opens a read transaction, which in WAL mode
    needs the log's ``-shm`` index."""
    conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar()


def _check_path(path: Path, where: str, mode: str) -> None:
    """Refuse a SQLite path that cannot be a database file before SQLite answers with a misleading
    code: a directory (``SQLITE_CANTOPEN``, read as a permission problem), or a path whose
    directories run through a file (``mkdir`` fails, as if for want of permission), or a path the
    operating system refuses to look at (a name too long, say), which ``Path.is_dir`` and
    ``exists`` raise as a bare OSError."""
    try:
        if path.is_dir():
            raise OpenError("not_a_database", "open", f"{open_detail('not_a_database', where)}: it is a directory")
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise OpenError("open_failed", "open",
                                    f"{open_detail('open_failed', where)}: {parent} is not a directory")
                return
    except OSError as exc:
        problem = "permission_denied" if isinstance(exc, PermissionError) else "open_failed"
        why = os.strerror(exc.errno) if exc.errno else type(exc).__name__  # never the path OSError quotes
        detail = open_detail(problem, where, mode=mode)
        raise OpenError(problem, "open", detail if problem == "permission_denied" else f"{detail}: {why}") from None


class Database:
    """An engine plus the write/read discipline every store shares."""

    def __init__(self, url: str | None = None, *, readonly: bool = False, group_commit: bool = True,
                 make_dirs: bool = True) -> None:
        """``make_dirs=False``: a writable SQLite database's missing parent directories are made
        by ``make_dirs()``, not here (a caller that may only read makes none)."""
        self.url = resolve_url(url)
        problem: str | None = None
        try:
            parsed, options = parse_url(self.url)
        except ValueError as exc:
            if not from_environment(url):
                raise
            problem = str(exc)
        if problem is not None:  # raised outside the except, as parse_url raises its own
            raise ValueError(f"{ENV_SOURCE}: {problem}")
        self.readonly = readonly
        # The most connections (so transactions in progress) at once; the pool keeps up to
        # POOL_SIZE of them open between uses.
        self.pool_limit = int(options["pool_size"]) if "pool_size" in options else POOL_SIZE + POOL_OVERFLOW
        pool_args = {"pool_size": min(POOL_SIZE, self.pool_limit),
                     "max_overflow": self.pool_limit - min(POOL_SIZE, self.pool_limit)}
        backend_name = parsed.get_backend_name()
        if backend_name == "sqlite":
            path = Path(parsed.database or "")  # parse_url refused an empty or in-memory one
            # Absolute once, here: a relative path resolved later (a new connection, a follower's
            # watch, a file identity check) would name another file once the process changed
            # directory. Joined, not normalized: ``link/..`` is where the link leads, as the OS
            # resolves it. Messages still name the path as it was given.
            self._given = str(path)
            with contextlib.suppress(OSError):  # no current directory: SQLite's open says so
                path = Path.cwd() / path
            parsed = parsed.set(database=str(path))
            self.backend: Backend = SqliteBackend(str(path))
            self.path: Path | None = path
            _check_path(path, self.where, "reading" if readonly else "writing")
            if readonly:
                if not path.exists():
                    raise DatabaseMissing("database_missing", "open",
                                          open_detail("database_missing", self.where, sqlite=True))
                # Each connection decides whether it opens the file as immutable (see frozen_copy).
                parsed = parsed.set(database=readonly_uri(str(path)),
                                    query={**parsed.query, "uri": "true"})
            elif make_dirs:
                self.make_dirs()
            self.engine: Engine = create_engine(
                parsed,
                connect_args={"check_same_thread": False, "timeout": 30},
                hide_parameters=True,  # statement parameters carry user data: never in SQLAlchemy's log
                **pool_args,
            )
            self.schema: str | None = None
        else:  # postgresql: parse_url refused every other scheme
            try:
                import psycopg  # noqa: F401 - the driver is the optional extra fencepost[postgres]
            except ImportError:
                raise OpenError(
                    "driver_missing", "open",
                    "a PostgreSQL URL needs the psycopg driver: pip install 'fencepost[postgres]'",
                ) from None
            if parsed.get_driver_name() not in ("psycopg", "psycopg_async"):
                parsed = parsed.set(drivername="postgresql+psycopg")
            self.schema = options.get("schema", DEFAULT_SCHEMA)
            self.backend = PostgresBackend(self.schema)
            self.path = None
            self.engine = create_engine(
                parsed,
                hide_parameters=True,  # statement parameters carry user data: never in SQLAlchemy's log
                **pool_args,
                # Defaults a URL's own ``connect_timeout`` / application name overrides.
                # UTF8 always, in the startup message: it overrides the role's and the database's
                # client_encoding and PGCLIENTENCODING (a URL asking for another was refused).
                connect_args={
                    **({} if "connect_timeout" in parsed.query else {"connect_timeout": PG_CONNECT_TIMEOUT_S}),
                    **pg_session_name(parsed.query, "fencepost"), "client_encoding": "UTF8"},
            )
        watcher = getattr(_watchers, "built", None)
        if watcher is not None:
            watcher(self.engine)
        self.backend.configure(self.engine, readonly=readonly, options=options)
        self._read_options = self.backend.read_options()
        self._local = threading.local()
        self._slots: weakref.WeakSet[_Slot] = weakref.WeakSet()
        self._slots_lock = threading.Lock()
        self._checkout_lock = threading.Lock()
        self._connecting = 0  # checkouts let through ``_checkout_lock`` and not yet counted by the pool
        # Connections taken back from idle threads, counted by their pool until released: per pool,
        # since ``dispose`` puts a new pool in place that never counted the ones still on their way
        # back to the old one.
        self._releasing: dict[Any, int] = {}
        # A taken-back connection stops counting as releasing as the pool takes it in, before the
        # pool counts it free (after its reset, the slow part): never one place too many.
        this = weakref.ref(self)  # the engine must not keep the store alive

        def checked_in(_dbapi_connection: Any, record: Any) -> None:
            db = this()
            if db is not None:
                db._returned(record.record_info)

        event.listen(self.engine, "checkin", checked_in)
        self._wake = threading.Event()  # set by ``dispose`` (and ``close``): checkouts waiting look again
        self._pid = os.getpid()
        self.closed = False
        # Concurrent top-level writes of this process share one COMMIT (see _group.py).
        self._group = GroupCommit(self) if group_commit and not readonly else None

    @property
    def where(self) -> str:
        """The database, safe to print: the SQLite path, or the URL with its password masked."""
        return self._given if self.path is not None else redact_url(self.url)

    def probe(self) -> None:
        """Connect once, without retrying, so an open that cannot even connect says why at once."""
        found = self.connect_problem()
        if found is not None:
            # Outside the handler: the driver's exception quotes the URL.
            raise self._open_error(found.problem, found.code, found.note, transient=found.transient)

    def vetted(self, check: Callable[[], T], *, confirm: bool = False) -> T:
        """Run ``check`` (the reads that decide whether a read-only open is refused) and return
        what it returns. SQLite only (elsewhere, and on a writable store, just ``check()``): when
        nobody has the file open, its reads open it as immutable, so a refused open leaves no
        ``-wal``/``-shm`` beside the user's file (reading a WAL database through SQLite's own
        locking creates them, and a read-only connection cannot remove them). Those connections
        are closed before it returns; if the file, its ``-wal`` or ``-shm`` changed meanwhile (a
        writer came along), ``check`` runs again the ordinary way and that outcome counts. With
        ``confirm`` (an open whose store is read next), an accepted file is then read once the
        ordinary way, so a failure only that way meets refuses the open."""
        backend = self.backend
        if not self.readonly or not isinstance(backend, SqliteBackend) or backend.path is None:
            return check()
        path = os.path.abspath(backend.path)
        before = unused_state(path)
        if before is None:  # someone has it open (or it needs its log): its files are there already
            return check()
        backend.vetting = True
        failure: BaseException | None = None
        try:
            result = check()
        except Exception as exc:
            failure = exc
        finally:
            backend.vetting = False
            self.dispose()
        if unused_state(path) != before:
            return check()  # a writer came along: the ordinary reads' outcome counts, not the first one's
        if failure is not None:
            raise failure
        if confirm:
            # Accepted, and about to be read: read it once the ordinary way, through the log's
            # index, so what only that way meets (a full disk with no room for the -shm index)
            # refuses the open now instead of failing the store's first read.
            self.read(_read_schema)
        return result

    def make_dirs(self) -> None:
        """Make a SQLite database's missing parent directories (nothing for PostgreSQL); a failure
        is ``OpenError('permission_denied')`` naming the path."""
        if self.path is None:
            return
        made = True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            made = False
        if not made:
            raise OpenError("permission_denied", "open", open_detail("permission_denied", self.where))

    def missing_namespace(self) -> str | None:
        """``no schema NAME at URL`` (the URL masked) when the store's PostgreSQL schema does not
        exist, else ``None``: a SQLite file is its own namespace, and a missing one never opens read-only.
        A failure to read the catalog raises ``DbFailure``."""
        if self.schema is None or self.read(self.backend.namespace_exists):
            return None
        return f"no schema {self.schema} at {self.where}"

    def connect_problem(self) -> ConnectProblem | None:
        """Connect once, without retrying: ``None`` when it connects, else why not (``ConnectProblem``).
        The connection is checked out as every call's is (``_checkout``): straight from the pool, a
        small one whose connections idle threads keep would wait out the pool's own timeout."""
        try:
            self._checkout().close()
        except DBAPIError as exc:
            _category, code = self.backend.classify(exc)
            problem, note = self.backend.open_problem(code), None
            if problem is None and code is None:
                note = self.backend.no_answer(self.engine, exc)
                if note is not None:
                    # The server took no part within the connect timeout: an outage, and asking it
                    # anything more would only wait out the timeout again.
                    return ConnectProblem("cannot_connect", None, note, True)
                # A refused login, a URL option the driver or the server refuses, and a server
                # that does not answer all reach libpq as a lost connection would (no code): the
                # diagnosis decides, and only a server that cannot take the connection now
                # (``cannot_connect``) is worth waiting for.
                problem, note, code = self.backend.explain_connect(self.engine)
                if problem != "cannot_connect" and self._connects():
                    # What refused the connection had ended by the time the diagnosis asked the
                    # server (a full server's session ended, say), which then saw only credentials
                    # that work elsewhere. Trust the connection, not a verdict about a moment past.
                    return None
                return ConnectProblem(problem, code, note, problem == "cannot_connect")
            if problem is None:
                note = self.backend.reason(exc, code)  # another writer's lock, a timeout ...
            problem = problem or "open_failed"
            transient = problem in ("cannot_connect", "open_failed") and self.backend.is_transient(exc)
            return ConnectProblem(problem, code, note, transient)
        return None

    def _connects(self) -> bool:
        try:
            self._checkout().close()
        except DBAPIError:
            return False
        return True

    def open_error(self, exc: DbFailure) -> OpenError:
        """The public error for a database failure while opening the store (an ``open_failed``
        one says why, when the failure's code does: another writer's lock, a timeout ...)."""
        problem = self.backend.open_problem(exc.code) or "open_failed"
        return self._open_error(problem, exc.code, exc.reason if problem == "open_failed" else None,
                                transient=exc.transient)

    def _open_error(self, problem: str, code: str | None, note: str | None = None, *,
                    transient: bool = False) -> OpenError:
        err = OpenError(problem, "open", self.open_detail(problem, note), db_code=code)
        err.transient = transient
        return err

    def open_detail(self, problem: str, note: str | None = None) -> str:
        """What is wrong opening this database, naming only its path or masked URL (and ``note``)."""
        return open_detail(problem, self.where, mode="reading" if self.readonly else "writing",
                           sqlite=self.path is not None, note=note)

    # ------------------------------------------------------------------ transactions
    def write(self, fn: Callable[[Connection], T], *, durable: bool = True, alone: bool = False) -> T:
        """Run ``fn(conn)`` in one serialized write transaction and return its result.

        Nested inside another ``write`` (same thread or task), ``fn`` runs in a savepoint of the
        outer transaction. Transient failures retry the whole outermost ``fn``; other driver
        failures raise ``DbFailure``; a ``FencepostError`` raised by ``fn`` rolls back and
        propagates unchanged.

        ``durable=False`` (a top-level write only; nested, the outer transaction decides): the
        COMMIT does not wait for the disk (SQLite at ``synchronous`` FULL or EXTRA: NORMAL for this
        transaction; PostgreSQL: ``synchronous_commit`` off). It stays atomic and the database
        consistent, but a power loss (a server crash on PostgreSQL) may undo it, whole, until a
        later durable commit on the same database. Such a write never shares its COMMIT with
        concurrent writes (group commit), whose durability is theirs.

        ``alone=True`` (a top-level write): never handed to group commit, so ``fn`` runs on this
        thread in a transaction of its own, for a body that holds this store's write lock while it
        writes other stores (the shard set's membership changes).
        """
        if self.closed:
            raise _closed()  # each store maps it to its own error class
        if self.readonly:
            raise _read_only()
        active = _current.get()  # ``_active()``, inline: every write asks
        txn = active.get(id(self)) if active else None
        if txn is not None and txn.pid == PROCESS.pid:
            if not txn.write:
                raise PersistenceError("persistence_failed", "write", "a write cannot nest in a read")
            if self.backend.statement_running(txn.conn):
                # A signal handler that ran while its thread's statement waits for the server: the
                # connection is that statement's until it returns, which waits for this call.
                raise own_call_in_progress(True)
            registered = len(txn.after_commit)
            try:
                try:
                    with txn.conn.begin_nested():
                        return fn(txn.conn)
                except BaseException:
                    # The savepoint rolled back: so do the callbacks it registered (its effects are gone).
                    del txn.after_commit[registered:]
                    raise
            except DBAPIError as exc:
                if self.backend.is_transient(exc):
                    raise
                failure = self._failure(exc)
            raise failure  # outside the handler: the driver's exception is not kept as context
        if not durable:
            result = self._run(fn, write=True, durable=False)
        else:
            result = self._group.write(fn) if self._group is not None and not alone else self._run(fn, write=True)
        self.backend.wrote()
        return result

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` in one read-only snapshot (or inside the caller's open transaction)."""
        if self.closed:
            raise _closed()
        txn = self._active()
        if txn is not None:
            if self.backend.statement_running(txn.conn):
                raise own_call_in_progress(txn.write, nested=True)
            return fn(txn.conn)
        return self._run(fn, write=False)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the outermost write commits (never on rollback or retry)."""
        txn = self._active()
        if txn is None:
            callback()
        else:
            txn.after_commit.append(callback)

    def in_write(self) -> bool:
        txn = self._active()
        return bool(txn and txn.write)

    def _active(self) -> _Txn | None:
        """The transaction this thread or task has open on this database, if any (in this process)."""
        active = _current.get()
        txn = active.get(id(self)) if active else None
        if txn is not None and txn.pid != PROCESS.pid:
            return None  # inherited across fork(): the parent's transaction, on the parent's connection
        return txn

    def _run(self, fn: Callable[[Connection], T], *, write: bool, durable: bool = True,
             started: float | None = None) -> T:
        """``fn`` in a transaction of its own, retried while the failure is transient and the call
        has not yet waited out the store's wait for a lock, counted from ``started`` (a group-commit
        call run alone: when the call began, its wait in the group included; else now)."""
        delay = 0.005
        if started is None:
            started = time.monotonic()
        for attempt in range(1, MAX_ATTEMPTS + 1):
            failure: DbFailure | None = None
            try:
                return self._once(fn, write=write, durable=durable)
            except CommitUnknown as unknown:
                failure = unknown.failure
            except DbFailure as exc:
                if exc.reconnect and attempt < MAX_ATTEMPTS:
                    continue  # the stale connection is gone: start over on a new one
                raise
            except DBAPIError as exc:
                if (self.backend.is_transient(exc) and attempt < MAX_ATTEMPTS
                        and not self.backend.waited_out(exc, time.monotonic() - started)):
                    time.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 0.5)
                    continue
                failure = self._failure(exc)
            except SQLAlchemyError as exc:
                failure = self._failure(exc)
            # Outside the handler: the driver's exception is not kept even as ``__context__``.
            raise failure
        raise AssertionError("unreachable")  # pragma: no cover

    def _slot(self, write: bool) -> _Slot:
        """This thread's write (or read) connection, kept between transactions.

        Checking a connection out of the pool and wrapping it costs more than a short transaction
        itself, so each thread keeps one connection per role with its options set once. A forked
        child never reuses its parent's connections; a thread's connections return to the pool
        when the thread ends, and ``dispose`` closes them all.
        """
        if self._pid != PROCESS.pid:  # ``_after_fork()``, inline: every transaction comes here
            PROCESS.adopt(self, self._forget_parent)
        slot = getattr(self._local, "write" if write else "read", None)
        # Neither closed nor invalidated: SQLAlchemy's connection still holds its pool connection.
        if slot is not None and not slot.reclaimed and slot.conn._dbapi_connection is not None:
            return slot
        if slot is not None:
            slot.release()
        conn = self._checkout()
        if write:
            conn.execution_options(fencepost_write=True)
            self.backend.write_connection(conn)
        elif self._read_options:
            conn.execution_options(**self._read_options)
        _guard(conn)
        slot = _Slot(conn)
        setattr(self._local, "write" if write else "read", slot)
        with self._slots_lock:
            self._slots.add(slot)
        return slot

    def _after_fork(self) -> None:
        """In a forked child (first call there): forget the parent's connections, never use them."""
        if self._pid != PROCESS.pid:
            PROCESS.adopt(self, self._forget_parent)

    def _forget_parent(self) -> None:
        self._local = threading.local()
        self._slots = weakref.WeakSet()
        # A parent's thread may have held them at fork(): the child's copies stay held forever.
        self._slots_lock = threading.Lock()
        self._checkout_lock = threading.Lock()
        self._connecting = 0
        self._releasing = {}
        self._wake = threading.Event()
        self.engine.dispose(close=False)
        self._pid = PROCESS.pid  # last: another thread's first call goes on once this is set

    def _checkout(self) -> Connection:
        """A connection from the pool, taking back a kept connection of an idle thread first when
        the pool has none left; after ``POOL_WAIT`` seconds with every connection inside a
        transaction, a ``DbFailure`` (``pool_exhausted``, transient) that names the limit. A call
        waiting here when the store is closed raises the closed error at once.

        Threads keep their connections between calls (see ``_slot``), so a process with more
        threads than the pool holds (a worker host, many followers) would otherwise find the pool
        empty though most of those threads sit idle. A kept connection is taken back only when
        provably idle (``_Slot.claim_if_idle``); its thread checks out another at its next call.
        Every checkout of the store decides here, one at a time, whether it may go on (taking back
        one idle connection for itself if need be) and reserves its place, so threads that all
        found the pool empty cannot take each other's reclaimed connections and leave one waiting
        anyway. The slow parts run outside that lock: returning a taken-back connection (on
        PostgreSQL a rollback, which a server that stopped answering can hold up) and the checkout
        itself (a new connection waits up to its ``connect_timeout``); neither may hold up every
        other thread's checkout.
        """
        self._after_fork()  # ``connect`` and ``detached_connection`` come here without ``_slot``
        limit = self.pool_limit
        deadline = time.monotonic() + POOL_WAIT
        pause = 0.001
        while True:
            if self.closed:
                raise _closed()  # closed while this call waited: as any call after ``close``
            pool = self.engine.pool  # ``dispose`` puts a new one in place
            taken = None
            with self._checkout_lock:
                # Places in use: the pool's count, less the taken-back connections it still counts
                # (each one's place is its taker's), plus the reservations it does not count yet.
                in_use = pool.checkedout() + self._connecting - self._releasing.get(pool, 0)  # type: ignore[attr-defined]
                if in_use >= limit:
                    taken = self._claim_idle()
                    if taken is not None:
                        self._releasing[pool] = self._releasing.get(pool, 0) + 1
                        record = taken.conn.connection.record_info
                        assert record is not None  # a checked-out connection has its pool record
                        returning = record
                        returning[_RETURNING] = pool
                        in_use -= 1
                reserved = in_use < limit
                if reserved:
                    self._connecting += 1
            if taken is not None:
                try:
                    taken.release()  # back to the pool: the place this call reserved
                finally:
                    self._returned(returning)  # when the pool's checkin did not (already closed)
            if reserved:
                try:
                    # A free connection, or a new one: the reservation keeps the pool from waiting.
                    return self.engine.connect()
                except PoolTimeout:
                    pass  # taken by a checkout outside fencepost's (a test's engine.connect)
                except DBAPIError as exc:
                    setattr(exc, _CONNECTING, True)  # ``_failure`` asks the server why
                    raise
                finally:
                    with self._checkout_lock:  # the pool counts it now (or it failed)
                        self._connecting -= 1
            if time.monotonic() >= deadline:
                raise DbFailure(
                    "persistence_failed", "pool_exhausted",
                    f"no database connection came free within {POOL_WAIT:g} s: all {limit} connections "
                    "of the store's pool were inside transactions of other threads (the URL option "
                    "pool_size sets how many)", transient=True)
            self._wake.wait(pause)
            pause = min(pause * 2, 0.05)

    def _returned(self, info: dict[Any, Any]) -> None:
        """A connection whose pool record holds ``info`` is back in the pool (or gone): if it was
        taken back, it no longer counts as releasing. Once per taking, whoever gets here first
        (the pool's checkin, whichever thread returns it, or its taker afterwards)."""
        pool = info.pop(_RETURNING, None)
        if pool is not None:
            with self._checkout_lock:
                left = self._releasing.get(pool, 0) - 1
                if left > 0:
                    self._releasing[pool] = left
                else:
                    self._releasing.pop(pool, None)

    def _claim_idle(self) -> _Slot | None:
        """Holding ``_checkout_lock``: one kept connection no transaction is using (another
        thread's, or this one's other role), taken back and forgotten; the caller releases it.
        Connections already closed or invalidated hold no place in the pool: they are let go on
        the way, at no cost."""
        with self._slots_lock:
            slots = list(self._slots)
        for slot in slots:
            if not slot.claim_if_idle(self.backend.transaction_open):
                continue
            with self._slots_lock:
                self._slots.discard(slot)
            if slot.conn.closed or slot.conn.invalidated:
                slot.release()
                continue
            return slot
        return None

    def detached_connection(self) -> Connection:
        """A connection the pool no longer counts (closing it closes it), for a long-lived use
        beside the store's transactions: a follower's change detection must not hold one of the
        connections the pool keeps for them (the PostgreSQL listener has its own, likewise)."""
        if self.closed:
            raise _closed()
        conn = self._checkout()
        conn.detach()
        return conn

    def _once(self, fn: Callable[[Connection], T], *, write: bool, durable: bool = True) -> T:
        me = threading.get_ident()
        while True:
            slot = self._slot(write)
            if slot.holder == me:
                # Only code run in the middle of this thread's own transaction on this connection
                # (a signal handler, a finalizer) gets here, while that transaction begins or
                # commits (inside its body a call nests instead): waiting would be for itself.
                raise own_call_in_progress(write)
            try:
                # Marked before the lock is taken, so no moment of holding it goes unmarked (only
                # this thread uses its slot for transactions).
                slot.holder = me
                # Held for the whole transaction; ``slot`` stays referenced until it ends, so a
                # concurrent ``dispose`` that drops this thread's slots cannot close it under us.
                with slot.lock:
                    if slot.reclaimed or slot.conn.closed:  # taken back (a reclaim, ``dispose``) or closed
                        continue
                    result, txn = self._once_on(slot.conn, fn, write=write, durable=durable)
            finally:
                slot.holder = None
            break
        for callback in txn.after_commit:
            callback()
        return result

    def _once_on(self, conn: Connection, fn: Callable[[Connection], T], *, write: bool,
                 durable: bool = True) -> tuple[T, _Txn]:
        """One attempt. Whatever fails (BEGIN, a statement, COMMIT, ROLLBACK), ``_settle`` leaves
        ``conn`` with no transaction open, on the server too, or discards it: never a wedged
        connection, never a write lock held past the failure."""
        if durable or not write:
            return self._attempt(conn, fn, write=write, durable=True)
        try:
            relaxed = self.backend.relax_commit(conn)
        except Exception:
            relaxed = True  # unknown: put back, or discard the connection (below)
        try:
            return self._attempt(conn, fn, write=write, durable=False)
        finally:
            if relaxed and not conn.invalidated and not conn.closed:
                try:
                    self.backend.restore_commit(conn)
                except Exception:
                    # A connection whose level cannot be put back would commit later writes
                    # without waiting for the disk: never used again.
                    try:
                        conn.invalidate()
                    except Exception:
                        pass
                    self._drop(write)

    def _attempt(self, conn: Connection, fn: Callable[[Connection], T], *, write: bool,
                 durable: bool) -> tuple[T, _Txn]:
        unknown: DbFailure | None = None
        try:
            txn = _Txn(conn, write)
            outer = _current.get()
            active = dict(outer or {})
            active[id(self)] = txn
            trans = None
            try:
                trans = conn.begin()
                if write:
                    self.backend.begin_write(conn)
                    if not durable:
                        self.backend.relax_in_transaction(conn)
                # Set once the transaction has begun (a call made while it begins, from a signal
                # handler, cannot nest in it: it finds the connection held and is refused), and
                # inside the ``try`` whose ``finally`` clears it: a Ctrl-C landing just after must
                # not leave the thread marked as inside a transaction for good.
                _current.set(active)
                result = fn(conn)
            except BaseException as exc:
                # A driver error raised while the body fetched rows from a driver cursor (see
                # ``_statements.wrapped``) is classified like any other.
                failed = wrapped(conn.dialect, exc)
                self._settle(conn, trans, write, failed)
                if failed is not exc:
                    raise failed from None
                raise
            finally:
                _current.set(outer)
            if write and self.path is None and aborted(conn.connection.dbapi_connection):
                # PostgreSQL: a statement failed and the body went on (it caught the error), so
                # COMMIT would roll it all back, silently. Fail instead; never retried.
                self._settle(conn, trans, write, None)
                raise aborted_failure()
            try:
                trans.commit()
            except BaseException as exc:
                # A failed COMMIT leaves SQLAlchemy's transaction on the connection, and (deferred
                # constraint, full disk) the database's transaction open with its write lock.
                self._settle(conn, trans, write, exc)
                # A connection lost during COMMIT leaves the outcome unknown: retrying could
                # apply the body twice, so only a definite refusal (busy, serialization, a session
                # the server ended after rolling its transaction back) retries.
                # A read wrote nothing: its COMMIT failing is a read failing, retried as one.
                if not isinstance(exc, DBAPIError) or not write:
                    raise
                if self.backend.is_transient(exc) and not self.backend.commit_unknown(exc):
                    raise
                unknown = self._failure(exc, at_commit=True)
        except DBAPIError as exc:
            if exc.connection_invalidated or conn.invalidated:
                self._drop(write)
            raise
        if unknown is not None:
            # Raised here, outside the handler, so the driver's exception (its text may quote
            # values) is not even kept as ``__context__``.
            raise CommitUnknown(unknown)
        return result, txn

    def _settle(self, conn: Connection, trans: Any, write: bool, exc: BaseException | None) -> None:
        """After a failure: end the transaction on ``conn`` (SQLAlchemy's and the database's), or
        discard ``conn`` when that cannot be done or proven, or when ``exc`` says the connection
        itself is stale (a SQLite file opened read-only); the next call starts clean."""
        try:
            if trans is not None:
                # Also clears the failed-commit state SQLAlchemy keeps until a rollback.
                trans.rollback()
            raw = None if conn.invalidated or conn.closed else conn.connection.dbapi_connection
            if raw is not None:
                if self.backend.transaction_open(raw):
                    raw.rollback()
                if not self.backend.transaction_open(raw) and not self.backend.discard_after(exc):
                    return
        except Exception:  # a connection that cannot roll back is not trusted again
            pass
        # Closing the driver connection ends its transaction (SQLite rolls back and releases the
        # write lock; PostgreSQL rolls back when the session ends).
        try:
            conn.invalidate()
        except Exception:
            pass
        self._drop(write)

    def _failure(self, exc: BaseException, *, at_commit: bool = False) -> DbFailure:
        """The value-free failure for the driver's ``exc``, its cause in words when the code says
        one (``at_commit``: ``exc`` was raised by COMMIT, whose outcome it may leave unknown)."""
        category, code = self.backend.classify(exc)
        transient = self.backend.is_transient(exc)
        if at_commit and self.backend.commit_unknown(exc):
            # A COMMIT whose log write met a full disk (PostgreSQL answers with a PANIC, ending the
            # session) has an unknown outcome too; the caller is told the cause as well.
            full = self.backend.open_problem(code) == "disk_full"
            return DbFailure(category, code, f"the disk is full: {COMMIT_UNKNOWN}" if full else COMMIT_UNKNOWN,
                             transient=transient)
        reason = None
        if code is None and getattr(exc, _CONNECTING, False):
            # A new connection failed, and libpq keeps the server's refusal code to itself (no free
            # slot reads as a lost connection): ask the server, as an open that cannot connect does,
            # unless it already failed to answer within the connect timeout.
            reason = self.backend.no_answer(self.engine, exc)
            if reason is None:
                code, reason = self.backend.connect_refusal(self.engine)
        return DbFailure(category, code, reason or self.backend.reason(exc, code), transient=transient)

    def connect(self) -> Connection:
        """A plain connection (autobegin) for migrations, tests and tools.

        No connection (the pool stayed full, the store closed while this call waited, the server
        refused it): a ``PersistenceError`` carrying the failure's ``db_code`` and ``transient``."""
        failure: DbFailure | None = _closed() if self.closed else None
        if failure is None:
            try:
                return self._checkout()
            except DBAPIError as exc:
                failure = self._failure(exc)
            except DbFailure as exc:
                failure = exc
        # Raised outside the handler: the driver's message may quote the URL.
        raise carry_failure(PersistenceError(failure.category, "connect",
                                             failure.reason or "no connection to the database"), failure)

    def _drop(self, write: bool) -> None:
        slot = getattr(self._local, "write" if write else "read", None)
        if slot is not None:
            setattr(self._local, "write" if write else "read", None)
            slot.release()

    def close(self) -> None:
        """``dispose``, and refuse every later ``read``, ``write`` and ``connect`` (``Store.close``)."""
        self.closed = True
        self.dispose()

    def dispose(self) -> None:
        """Close every connection, including the ones threads keep between transactions (they are
        opened again on the next call)."""
        with self._slots_lock:
            slots = list(self._slots)
            self._slots = weakref.WeakSet()
        for slot in slots:
            # A slot inside another thread's transaction is left to it: it is closed when that
            # transaction ends and the thread drops it (this dispose forgets it below).
            slot.release_if_idle()
        self._local = threading.local()
        self.backend.close()
        # In a forked child the pooled connections are the parent's sessions: forget, never close.
        self.engine.dispose(close=self._pid == os.getpid())
        # Calls waiting for a connection look again now (after ``close``, to raise its error).
        wake, self._wake = self._wake, threading.Event()
        wake.set()

    @property
    def name(self) -> str:
        return self.backend.name


_OPEN_DETAILS = {
    "not_a_database": "{where} is not a SQLite database",
    "corrupt": "the database file {where} is corrupt",
    "cannot_connect": "cannot connect to {where} ({why})",
    "database_missing": "no database at {where}",
    "auth_failed": "authentication or role refused by {where}",
    "permission_denied": "permission denied opening {where} for {mode}",
    "needs_migrations": "{where} is not a migrated fencepost store; open it writable once (`fencepost init`)",
    "disk_full": "no space left on the disk of {where}",
    "migration_blocked": "the migration of {where} was blocked by another session's lock",
    "schema_too_new": "{where} has a newer schema than this version of fencepost (upgrade fencepost)",
    "schema_mismatch": ("a migration of {where} is recorded under another name than this version of fencepost "
                        "gives it (another build of fencepost migrated it, or flows_migrations was edited)"),
    "open_failed": "{where} could not be opened",
}


def open_detail(problem: str, where: str, *, mode: str = "writing", sqlite: bool | None = None,
                note: str | None = None) -> str:
    """The message of an ``OpenError``: what went wrong, naming only the path or the masked URL, and
    ``note`` (a value-free sentence the diagnosis adds; for ``cannot_connect``, why it could not)."""
    why = note if problem == "cannot_connect" and note else "no server accepts connections there"
    detail = _OPEN_DETAILS.get(problem, _OPEN_DETAILS["open_failed"]).format(where=where, mode=mode, why=why)
    if problem == "database_missing" and (sqlite if sqlite is not None else "://" not in where):
        detail += "; create it with `fencepost init`"
    elif problem == "database_missing" and "://" in where:
        # Never `fencepost init`: it creates a schema and its tables, not a database.
        detail += "; create the database first (CREATE DATABASE ... ENCODING 'UTF8'), fencepost creates none"
    if note and problem != "cannot_connect":
        detail += f"; {note}"
    return detail


def map_failure(exc: DbFailure, error_cls: type[FencepostError], method: str, subject: str) -> FencepostError:
    """Translate a ``DbFailure`` into a store error with a value-free message."""
    return carry_failure(error_cls(exc.category, method, failure_detail(subject, exc)), exc)


def carry_failure(err: E, exc: DbFailure) -> E:
    """``err`` (raised for the database failure ``exc``) with the driver's code (``db_code``) and
    whether waiting may cure it (``transient``), as every store error from the database carries them."""
    err.db_code = exc.code  # type: ignore[attr-defined]
    err.transient = exc.transient  # type: ignore[attr-defined]
    return err
