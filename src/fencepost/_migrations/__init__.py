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
PROJECTIONS = ("projections",)

_SAFE = 2**53 - 1
BEFORE: dict[int, tuple[str, tuple[str, ...]]] = {
    4003: ("a joined_at_ms stamp past 2^53 - 1 becomes 2^53 - 1, as 4004 makes it (4003 copies the stamp into "
           "founded_at_ms, which 4002 bounds)",
           (f"UPDATE flows_shard_membership SET joined_at_ms = {_SAFE} WHERE joined_at_ms > {_SAFE}",)),
}
"""Statements the runner runs just before a migration, in its place of the pass (and ``script``
prints them there), on both backends: what a merged migration needs first and, merged, cannot say
itself. Its id, then why and the statements."""

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


def ledger_namespaces(ledger: dict[int, str]) -> tuple[str, ...]:
    """The namespaces ``migrations status`` and ``migrations sql`` cover for a database with this ledger:
    the store's, and any other the ledger has begun (the projection builder's, on a database that
    is also a projection target). A ledger that records projection migrations alone is a projection
    target of its own: its namespace alone. A fresh database (no ledger): the store's."""
    begun = {ns for ns, start in BLOCKS.items() for i in ledger if start < i < start + 1000}
    if begun and begun <= set(PROJECTIONS):
        return PROJECTIONS
    return tuple(ns for ns in ALL_NAMESPACES if ns in STORE_NAMESPACES or ns in begun)


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


def permission_note(db: Database, namespaces: tuple[str, ...] = STORE_NAMESPACES) -> str | None:
    """What a refusal for want of rights adds when migrations are pending on an existing schema:
    which, and how they get applied. ``None`` when none is pending, when the database holds none of
    ``namespaces`` yet (nothing more to say), or when the ledger cannot be read."""
    try:
        todo = pending(db, namespaces)
    except (DbFailure, FencepostError):
        return None
    if not todo or len(todo) == len(discover(db.backend.migration_suffix, namespaces)):
        return None
    return (f"{pending_phrase(todo)}, which a role that owns the tables applies "
            "(`fencepost migrations sql` prints their SQL)")


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
           namespaces: tuple[str, ...] | None = None, altered: frozenset[int] = frozenset()) -> list[MigrationState]:
    """Every shipped migration of ``namespaces`` (``ledger_namespaces`` when None) with its state,
    then any the ledger has and the code lacks. ``altered``: applied migrations whose objects are
    missing (``damage``), listed ``altered``."""
    ledger = applied(db) if ledger is None else ledger
    namespaces = ledger_namespaces(ledger) if namespaces is None else namespaces
    shipped = discover(db.backend.migration_suffix, ALL_NAMESPACES)
    known = {m.id for m in shipped}
    rows = [MigrationState(m.id, m.recorded_name, "pending" if m.id not in ledger
                           else "mismatch" if ledger[m.id] != m.recorded_name
                           else "altered" if m.id in altered else "applied")
            for m in shipped if m.namespace in namespaces or m.id in ledger]
    rows += [MigrationState(i, ledger[i], "unknown") for i in sorted(ledger) if i not in known]
    return sorted(rows, key=lambda r: r.id)


def script(db: Database, ledger: dict[int, str], namespaces: tuple[str, ...] | None = None) -> str:
    """The SQL that applies every pending migration of ``namespaces`` (``ledger_namespaces`` when
    None) by hand (for a DBA), ledger included.

    The same statements the store runs when it migrates itself, each migration followed by its
    ledger row, for the URL's backend. Run it in one transaction (the PostgreSQL script begins and
    commits its own, and sets ``search_path`` for that transaction only).
    """
    namespaces = ledger_namespaces(ledger) if namespaces is None else namespaces
    pending_ = [m for m in discover(db.backend.migration_suffix, namespaces) if m.id not in ledger]
    if not pending_:
        return "-- nothing to apply: every migration is recorded in flows_migrations\n"
    out = [f"-- fencepost migrations for {db.backend.name}: {', '.join(str(m.id) for m in pending_)}",
           "-- Runs in one transaction of its own." if db.backend.script_epilogue() else "-- Apply in one transaction.",
           *[f"{s};" for s in db.backend.script_preamble()],
           _LEDGER[db.backend.name].strip() + ";"]
    for m in pending_:
        out.append(f"\n-- {m.id} {m.recorded_name}")
        if m.id in BEFORE:
            out.append(f"-- before {m.id}: {BEFORE[m.id][0]}")
            out += [f"{s};" for s in BEFORE[m.id][1]]
        out.append(m.script.strip())
        out.append(f"INSERT INTO flows_migrations (migration_id, name) VALUES ({m.id}, '{m.recorded_name}');")
    out += [f"{s};" for s in db.backend.script_epilogue()]
    return "\n".join(out) + "\n"


def pending(db: Database, namespaces: tuple[str, ...] = STORE_NAMESPACES) -> list[Migration]:
    """Migrations not yet applied (read without the write lock); a newer database is refused."""
    wanted = discover(db.backend.migration_suffix, namespaces)
    ledger = applied(db)
    check_ledger(db, ledger)
    return [m for m in wanted if m.id not in ledger]


# --------------------------------------------------------------------------- what the ledger promises

_AFTER_TRIGGER = re.compile(r"CREATE\s+TRIGGER\s+(\w+)\s+AFTER\b", re.IGNORECASE)
_MAKERS: dict[str, tuple[dict[str, int], dict[tuple[str, str], int]]] = {}


def _makers(db: Database) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Which store migration creates each object the open checks: every AFTER trigger (they write
    what the store relies on: revisions, tombstones, a deleted run's lease released, notifications;
    the BEFORE ones only refuse hand edits) by the last migration that creates it, and every column
    of the store's tables (``_schema``) by the first. Read from the migration files, once a backend
    (a process that patches ``discover`` clears ``_MAKERS``)."""
    found = _MAKERS.get(db.backend.name)
    if found is not None:
        return found
    from fencepost import _schema

    tables = {t.name: [c.name for c in t.columns] for t in _schema.metadata.sorted_tables
              if t.name != "flows_migrations"}
    triggers: dict[str, int] = {}
    columns: dict[tuple[str, str], int] = {}
    for m in discover(db.backend.migration_suffix, STORE_NAMESPACES):
        for name in _AFTER_TRIGGER.findall(m.script):
            triggers[name] = m.id
        for statement in db.backend.split_script(m.script):
            for table, names in tables.items():
                if re.search(rf"CREATE\s+TABLE\s+{table}\s*\(", statement, re.IGNORECASE):
                    made = [c for c in names if re.search(rf"^\s*{c}\s", statement, re.MULTILINE)]
                else:
                    made = [c for c in names if re.search(rf"ALTER\s+TABLE\s+{table}\s+ADD\s+COLUMN\s+{c}\b",
                                                          statement, re.IGNORECASE)]
                for c in made:
                    columns.setdefault((table, c), m.id)
    _MAKERS[db.backend.name] = (triggers, columns)
    return triggers, columns


@dataclass(frozen=True)
class Missing:
    """An object a migration the ledger records as applied created, not in the database (or, a
    trigger, disabled): ``trigger NAME`` or ``column TABLE.NAME``, and that migration's id."""

    what: str
    by: int


def _catalog(conn: Connection, db: Database, tables: list[str]) -> tuple[set[str], set[tuple[str, str]]]:
    """The enabled triggers on ``tables`` and their columns: one catalog query, by the catalogs'
    indexes on a table's name and namespace (a server holding thousands of tables answers as fast)."""
    names = ", ".join(f"'{t}'" for t in tables)  # fencepost's own table names
    if db.backend.name == "sqlite":
        rows = conn.exec_driver_sql(
            "SELECT 't', name, '' FROM sqlite_master WHERE type = 'trigger' UNION ALL "
            "SELECT 'c', m.name, p.name FROM sqlite_master AS m JOIN pragma_table_info(m.name) AS p "
            f"WHERE m.type = 'table' AND m.name IN ({names})").all()
    else:
        rows = conn.execute(text(
            "SELECT 't', g.tgname::text, '' FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid "
            f"WHERE c.relnamespace = to_regnamespace(:s) AND c.relname IN ({names}) "
            "AND NOT g.tgisinternal AND g.tgenabled <> 'D' UNION ALL "
            "SELECT 'c', c.relname::text, a.attname::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            f"WHERE c.relnamespace = to_regnamespace(:s) AND c.relkind IN ('r', 'p') AND c.relname IN ({names}) "
            "AND a.attnum > 0 AND NOT a.attisdropped"), {"s": getattr(db.backend, "schema", "")}).all()
    return ({str(r[1]) for r in rows if r[0] == "t"}, {(str(r[1]), str(r[2])) for r in rows if r[0] == "c"})


def read_state(conn: Connection, db: Database) -> tuple[dict[int, str], list[Missing]]:
    """The ledger and what the applied store migrations created that the database lacks, in one
    read (two catalog queries at most): what an open looks at before it trusts the schema."""
    ledger = _applied(conn, db)
    return ledger, damage(conn, db, ledger)


def damage(conn: Connection, db: Database, ledger: dict[int, str]) -> list[Missing]:
    """What the applied store migrations created that the database lacks (``[]`` with no ledger)."""
    if not ledger:
        return []
    triggers, columns = _makers(db)
    want_triggers = {t: mid for t, mid in triggers.items() if mid in ledger}
    want_columns = {tc: mid for tc, mid in columns.items() if mid in ledger}
    if not want_triggers and not want_columns:
        return []
    # Every trigger fencepost makes is on one of the store's tables (``_schema``), whose columns are read too.
    have_triggers, have_columns = _catalog(conn, db, sorted({t for t, _ in columns}))
    missing = [Missing(f"trigger {t}", mid) for t, mid in want_triggers.items() if t not in have_triggers]
    gone = {t for t, _ in want_columns} - {t for t, _ in have_columns}  # whole tables: named as such
    missing += [Missing(f"table {t}", min(mid for (t2, _), mid in want_columns.items() if t2 == t)) for t in gone]
    missing += [Missing(f"column {t}.{c}", mid) for (t, c), mid in want_columns.items()
                if t not in gone and (t, c) not in have_columns]
    return sorted(missing, key=lambda x: (x.by, x.what))


def damage_phrase(missing: list[Missing]) -> str:
    """``trigger flows_runs_revision_update (migration 1003), column ...`` (at most ten named)."""
    named = ", ".join(f"{x.what} (migration {x.by})" for x in missing[:10])
    return named + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")


def damage_error(db: Database, missing: list[Missing]) -> OpenError:
    """The refusal of a store whose schema lacks what its ledger says was applied, in the words a
    statement that meets a missing table or column uses (``MISSING_OBJECT``)."""
    kinds = {x.what.split(" ", 1)[0] for x in missing}
    what = ("a trigger fencepost needs is missing or disabled" if kinds == {"trigger"}
            else "a table or column fencepost needs is missing" if "trigger" not in kinds
            else "a table, column or trigger fencepost needs is missing")
    return OpenError("schema_mismatch", "open",
                     f"{db.where}: {what} (dropped, renamed or disabled by hand?): {damage_phrase(missing)}; "
                     "fencepost does not open it, for changes could go missing from the change feed or be "
                     "recorded wrongly: restore them, or the database from a backup (`fencepost migrations "
                     "status` lists them)")


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
    why: list[str | None] = []  # why the database refused its statement, when fencepost can say

    def body(conn: Connection) -> list[int]:
        running.clear()  # a try before this one may have stopped in a migration
        why.clear()
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
            for statement in [*BEFORE.get(m.id, ("", ()))[1], *db.backend.split_script(m.script)]:
                try:
                    conn.exec_driver_sql(statement)
                except DBAPIError as exc:
                    if wait_s is None or not db.backend.lock_wait_expired(exc):
                        why[:] = [_refused(db, exc)]
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
            if running and not exc.transient and db.backend.open_problem(exc.code) in (None, "open_failed"):
                # A migration the database refused (a row its new bound refuses, an object it creates
                # made by hand ...): say which migration, not just that the store could not be opened.
                # What the database itself says of the store (no permission, a full disk ...) keeps its
                # own words. The pass is one transaction: nothing of it stays.
                m = running[0]
                reason = ("a row breaks a constraint" if exc.category == "constraint" and not exc.reason
                          else (why[0] if why and why[0] else None) or exc.reason
                          or "the database refused one of its statements")
                raise DbFailure(exc.category, exc.code,
                                f"migration {m.id} ({m.recorded_name}) could not be applied: {reason}; no "
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


# Driver codes of an object that is already there (PostgreSQL: duplicate table, object, column, schema, function).
_EXISTS_CODES = frozenset({"42P07", "42710", "42701", "42P06", "42723"})
_EXISTS = "an object it creates already exists (made by hand, or its row of flows_migrations deleted?)"


def _refused(db: Database, exc: DBAPIError) -> str | None:
    """Why the database refused a migration's statement, in fencepost's words, when its code (or, on
    SQLite, which names no finer code, the kind of its message) says: an object already there."""
    code = db.backend.classify(exc)[1]
    if code in _EXISTS_CODES:
        return _EXISTS
    said = str(getattr(exc, "orig", "")) if db.backend.name == "sqlite" else ""
    if code == "SQLITE_ERROR" and (said.endswith("already exists") or said.startswith("duplicate column name")):
        return _EXISTS
    return None


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
