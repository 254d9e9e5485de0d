"""Numbered SQL migrations, applied once, in one pass, in one write transaction.

Files are ``<id>_<namespace>_<name>.<sqlite|postgresql>.sql``. Namespaces own id blocks of 1000
(journal 0, run-store 1000, changefeed 2000, projections 3000, shards 4000), as upstream's loader does. The
ledger is ``flows_migrations``. The pass runs under the durable writer's lock, so several
processes opening one fresh database at once apply each migration exactly once.

A pass never waits without limit for another session's lock: on PostgreSQL each try bounds its
table-lock waits (``lock_timeout``, for its transaction only) and the pass tries a few times with a
pause between tries, so readers queued behind a waiting ``ALTER TABLE`` get through; on SQLite the
busy timeout bounds the write lock's wait. Then it fails with ``OpenError`` ``migration_blocked``,
having changed nothing (see docs/decisions.md).
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from importlib import resources

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from fencepost._durable import Database, DbFailure, open_detail
from fencepost.errors import FencepostError, OpenError

_NAME = re.compile(r"^(\d{4})_([a-z-]+)_([a-z0-9_]+)\.(sqlite|postgresql)\.sql$")
BLOCKS = {"journal": 0, "run-store": 1000, "changefeed": 2000, "projections": 3000, "shards": 4000}
ALL_NAMESPACES = tuple(BLOCKS)
STORE_NAMESPACES = ("journal", "run-store", "changefeed", "shards")
READS_AROUND = frozenset({4002, 4003, 4004})
"""Migrations a read-only open does without: the code that reads what they add checks the ledger
first and reads the schema as it was before them. A store missing only these opens read-only (a
store a previous version left); a writable open applies them."""

#: Seconds each try of a PostgreSQL migration pass waits for a table lock (its ``lock_timeout``)
#: when the session sets none of its own (a URL's ``options=-c lock_timeout=...`` replaces it).
MIGRATION_LOCK_TIMEOUT_S = 2.0
#: Tries of a PostgreSQL migration pass whose lock wait expired, before it fails ``migration_blocked``.
MIGRATION_LOCK_ATTEMPTS = 5


@dataclass(frozen=True)
class Migration:
    id: int
    namespace: str
    name: str
    script: str

    @property
    def recorded_name(self) -> str:
        return f"{self.namespace}_{self.name}"


def discover(suffix: str, namespaces: tuple[str, ...] = ALL_NAMESPACES) -> list[Migration]:
    """Every migration file for one backend, in id order, checked against its block."""
    found: list[Migration] = []
    for entry in resources.files(__name__).iterdir():
        m = _NAME.match(entry.name)
        if not m or m.group(4) != suffix:
            continue
        mid, namespace, name = int(m.group(1)), m.group(2), m.group(3)
        if namespace not in BLOCKS:
            raise ValueError(f"migration namespace is not registered: {namespace}")
        if not BLOCKS[namespace] < mid < BLOCKS[namespace] + 1000:
            raise ValueError(f"migration id {mid} is outside the {namespace} block")
        if namespace in namespaces:
            found.append(Migration(mid, namespace, name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.id)
    ids = [m.id for m in found]
    if len(ids) != len(set(ids)):
        raise ValueError("two migrations share an id")
    return found


_LEDGER = {
    "sqlite": """CREATE TABLE IF NOT EXISTS flows_migrations (
        migration_id INTEGER NOT NULL PRIMARY KEY,
        name TEXT NOT NULL
    )""",
    "postgresql": """CREATE TABLE IF NOT EXISTS flows_migrations (
        migration_id INTEGER NOT NULL PRIMARY KEY,
        name TEXT NOT NULL
    )""",
}


def _ledger_exists(conn: Connection, db: Database) -> bool:
    return db.backend.has_table(conn, "flows_migrations")


def _applied(conn: Connection, db: Database) -> dict[int, str]:
    if not _ledger_exists(conn, db):
        return {}
    return {int(r[0]): r[1] for r in conn.exec_driver_sql("SELECT migration_id, name FROM flows_migrations")}


def applied(db: Database) -> dict[int, str]:
    """The ledger: every applied migration id and its recorded name (``{}`` before the first pass)."""
    return db.read(lambda conn: _applied(conn, db))


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids[:10]) + (", ..." if len(ids) > 10 else "")


def check_not_newer(db: Database, ledger: dict[int, str]) -> None:
    """Refuse a database whose ledger records migrations this code does not ship (it is newer)."""
    known = {m.id for m in discover(db.backend.migration_suffix, ALL_NAMESPACES)}
    unknown = sorted(set(ledger) - known)
    if unknown:
        raise OpenError("schema_too_new", "open",
                        f"{open_detail('schema_too_new', db.where)}; unknown migration(s): {_ids(unknown)}")


def mismatched(db: Database, ledger: dict[int, str]) -> list[int]:
    """The ids the ledger records under another name than this code gives them."""
    return [m.id for m in discover(db.backend.migration_suffix, ALL_NAMESPACES)
            if m.id in ledger and ledger[m.id] != m.recorded_name]


def check_ledger(db: Database, ledger: dict[int, str]) -> None:
    """Refuse a ledger this code cannot build on: migrations it does not ship (``schema_too_new``),
    or one of its own recorded under another name (``schema_mismatch``). Never changes anything."""
    check_not_newer(db, ledger)
    renamed = mismatched(db, ledger)
    if renamed:
        raise OpenError("schema_mismatch", "open",
                        f"{open_detail('schema_mismatch', db.where)}; migration(s): {_ids(renamed)}")


def pending_detail(db: Database, todo: list[Migration], namespaces: tuple[str, ...] = STORE_NAMESPACES) -> str:
    """Why a read-only open is refused: no fencepost store at all, or which migrations it lacks."""
    if len(todo) == len(discover(db.backend.migration_suffix, namespaces)):
        return open_detail("needs_migrations", db.where)
    return (f"{db.where} needs migrating: {pending_phrase(todo)}; apply them with `fencepost init` "
            "(or print their SQL with `fencepost migrations sql`)")


def pending_phrase(todo: list[Migration]) -> str:
    """``2 migration(s) pending (1006, 4001)``."""
    return f"{len(todo)} migration(s) pending ({_ids([m.id for m in todo])})"


@dataclass(frozen=True)
class MigrationState:
    """One row of ``fencepost migrations status``: ``applied``, ``pending``, ``unknown`` (newer code)
    or ``mismatch`` (recorded under another name than this code gives it)."""

    id: int
    name: str
    state: str


def status(db: Database, ledger: dict[int, str] | None = None,
           namespaces: tuple[str, ...] = STORE_NAMESPACES) -> list[MigrationState]:
    """Every shipped migration of ``namespaces`` with its state, then any the ledger has and the code lacks."""
    ledger = applied(db) if ledger is None else ledger
    shipped = discover(db.backend.migration_suffix, ALL_NAMESPACES)
    known = {m.id for m in shipped}
    rows = [MigrationState(m.id, m.recorded_name, "pending" if m.id not in ledger
                           else "applied" if ledger[m.id] == m.recorded_name else "mismatch")
            for m in shipped if m.namespace in namespaces or m.id in ledger]
    rows += [MigrationState(i, ledger[i], "unknown") for i in sorted(ledger) if i not in known]
    return sorted(rows, key=lambda r: r.id)


def script(db: Database, ledger: dict[int, str], namespaces: tuple[str, ...] = STORE_NAMESPACES) -> str:
    """The SQL that applies every pending migration of ``namespaces`` by hand (for a DBA), ledger included.

    The same statements the store runs when it migrates itself, each migration followed by its
    ledger row, for the URL's backend. Run it in one transaction (the PostgreSQL script begins and
    commits its own, and sets ``search_path`` for that transaction only).
    """
    pending_ = [m for m in discover(db.backend.migration_suffix, namespaces) if m.id not in ledger]
    if not pending_:
        return "-- nothing to apply: every migration is recorded in flows_migrations\n"
    out = [f"-- fencepost migrations for {db.backend.name}: {', '.join(str(m.id) for m in pending_)}",
           "-- Runs in one transaction of its own." if db.backend.script_epilogue() else "-- Apply in one transaction.",
           *[f"{s};" for s in db.backend.script_preamble()],
           _LEDGER[db.backend.name].strip() + ";"]
    for m in pending_:
        out.append(f"\n-- {m.id} {m.recorded_name}")
        out.append(m.script.strip())
        out.append(f"INSERT INTO flows_migrations (migration_id, name) VALUES ({m.id}, '{m.recorded_name}');")
    out += [f"{s};" for s in db.backend.script_epilogue()]
    return "\n".join(out) + "\n"


def needed_to_read(db: Database) -> list[Migration]:
    """The pending store migrations a read-only open cannot do without (``pending`` less ``READS_AROUND``)."""
    return [m for m in pending(db) if m.id not in READS_AROUND]


def pending(db: Database, namespaces: tuple[str, ...] = STORE_NAMESPACES) -> list[Migration]:
    """Migrations not yet applied (read without the write lock); a newer database is refused."""
    wanted = discover(db.backend.migration_suffix, namespaces)
    ledger = applied(db)
    check_ledger(db, ledger)
    return [m for m in wanted if m.id not in ledger]


# How a store's user runs a blocked migration again (``migrate``'s ``again``).
_AGAIN = "`fencepost init`, or open the store again"


class _Blocked(Exception):
    """A migration statement gave up waiting for a lock (raised inside the pass's transaction,
    which rolls back: not a driver error, so the write is not retried as a transient one)."""

    def __init__(self, statement: str, wait_s: float, code: str | None) -> None:
        super().__init__("lock wait expired")
        self.statement = statement
        self.wait_s = wait_s
        self.code = code


def migrate(db: Database, namespaces: tuple[str, ...] = STORE_NAMESPACES, *, again: str = _AGAIN) -> list[int]:
    """Apply every missing migration of ``namespaces`` in one write transaction; return their ids.

    A lock another session holds past the wait (see the module docstring) fails the pass with
    ``OpenError`` ``migration_blocked`` (transient); nothing of it is applied. ``again`` says how
    the caller's user runs the migration again (a projection target is not a store: no ``init``)."""
    wanted = discover(db.backend.migration_suffix, namespaces)
    # A SQLite file that does not exist yet has nothing applied; anything else may be current already.
    if db.path is None or db.path.exists():
        try:
            if not pending(db, namespaces):
                return []
        except OpenError:
            raise
        except Exception:
            pass  # a schema that does not exist yet: fall through to the locked pass

    running: list[Migration] = []  # the migration whose statements are running, if any

    def body(conn: Connection) -> list[int]:
        running.clear()  # a try before this one may have stopped in a migration
        db.backend.prepare_schema(conn)
        conn.exec_driver_sql(_LEDGER[db.backend.name])
        ledger = _applied(conn, db)
        check_ledger(db, ledger)
        wait_s = db.backend.bound_lock_waits(conn, MIGRATION_LOCK_TIMEOUT_S)
        done: list[int] = []
        for m in wanted:
            if m.id in ledger:
                continue
            running[:] = [m]
            for statement in db.backend.split_script(m.script):
                try:
                    conn.exec_driver_sql(statement)
                except DBAPIError as exc:
                    if wait_s is None or not db.backend.lock_wait_expired(exc):
                        raise
                    blocked = _Blocked(statement, wait_s, db.backend.classify(exc)[1])
                    raise blocked from None  # the driver's text may quote the statement
            running.clear()
            conn.execute(
                text("INSERT INTO flows_migrations (migration_id, name) VALUES (:id, :name)"),
                {"id": m.id, "name": m.recorded_name},
            )
            done.append(m.id)
        if wait_s is not None:
            db.backend.unbound_lock_waits(conn)
        return done

    attempts = max(1, MIGRATION_LOCK_ATTEMPTS)
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        try:
            return db.write(body)
        except _Blocked as exc:
            blocked = exc
        except DbFailure as exc:
            if exc.category == "constraint" and running and not exc.reason:
                # A row a migration's new bound refuses (one edited by hand): say which migration,
                # not just that the store could not be opened. The pass is one transaction: nothing stays.
                m = running[0]
                raise DbFailure(exc.category, exc.code,
                                f"a row breaks a constraint migration {m.id} ({m.recorded_name}) adds; no "
                                "migration was applied") from None
            if not (exc.transient and db.backend.migration_lock_waited(exc.code)):
                raise
            # SQLite's write lock, past the busy timeout (which bounds the whole wait): the reason names it.
            raise _blocked_error(db, exc.code, f"{exc.reason or 'another connection held a lock past the wait'}; "
                                 f"{_what_to_do(again)}") from None
        if attempt < attempts:
            # Readers queued behind the expired request get through before the next try.
            time.sleep(min(blocked.wait_s, 1.0) * (0.5 + random.random() / 2))
    raise _blocked_error(db, blocked.code, _blocked_note(db, blocked, attempts, time.monotonic() - started, again))


def _what_to_do(again: str, ending: str = "(COMMIT or ROLLBACK)") -> str:
    return (f"end the blocking session's transaction {ending}, then run the migration again ({again}); "
            "nothing was changed")


def _blocked_error(db: Database, code: str | None, note: str) -> OpenError:
    err = OpenError("migration_blocked", "open", open_detail("migration_blocked", db.where, note=note), db_code=code)
    err.transient = True  # the same pass succeeds once the lock is free
    return err


def _blocked_note(db: Database, blocked: _Blocked, attempts: int, elapsed_s: float, again: str) -> str:
    """What held the pass up: the table and the sessions holding a lock on it, when they can still
    be seen (pids and states only), and what to do."""
    words = set(_WORD.findall(blocked.statement.lower()))
    holders: list[tuple[str, int, str | None]] = []
    try:
        holders = db.read(lambda conn: db.backend.lock_holders(conn, words, blocked.wait_s))
    except (DbFailure, FencepostError):
        pass  # no diagnosis: the message says what is known
    tables = sorted({t for t, _, _ in holders})
    what = f"a lock on table{'s' if len(tables) > 1 else ''} {', '.join(tables)}" if tables else "a table lock"
    note = (f"{what} could not be taken within {elapsed_s:.1f} s ({attempts} tries, each waiting "
            f"{blocked.wait_s:g} s: lock_timeout)")
    if holders:
        seen = {pid: state for _, pid, state in holders}
        sessions = ", ".join(f"pid {pid}" + (f" ({state})" if state else "") for pid, state in seen.items())
        note += f"; held by the session{'s' if len(seen) > 1 else ''} {sessions}"
        ending = f"(COMMIT or ROLLBACK, or pg_terminate_backend({holders[0][1]}))"
        return note + "; " + _what_to_do(again, ending)
    return note + f"; another session held it: {_what_to_do(again)}"


_WORD = re.compile(r"[a-z_][a-z0-9_]*")
