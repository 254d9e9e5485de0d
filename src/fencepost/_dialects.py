"""The only module that tells SQLite from PostgreSQL.

Each backend class answers the same questions: how to configure a fresh engine, how a write
transaction begins (SQLite ``BEGIN IMMEDIATE``; PostgreSQL a per-schema advisory lock taken first),
how a read snapshot begins, which driver errors are transient, and how to build an upsert.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from sqlalchemy import Text, bindparam, case, event, func, literal, text
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

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
_PG_TRANSIENT_CODES = {"40001", "40P01", "55P03", "57P01", "57P02", "57P03"}
_PG_TRANSIENT_CLASSES = {"08"}


class Backend:
    name: str
    migration_suffix: str

    def configure(self, engine: Engine, *, readonly: bool, options: dict[str, str]) -> None:
        raise NotImplementedError

    def begin_write(self, conn: Connection) -> None:
        """Run first in every write transaction (after BEGIN)."""

    def read_options(self) -> dict[str, Any]:
        return {}

    def is_transient(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def classify(self, exc: BaseException) -> tuple[str, str | None]:
        """Return ``(category, code)``: category is ``constraint`` or ``persistence_failed``."""
        raise NotImplementedError

    def insert(self, table: Any) -> Any:
        raise NotImplementedError

    def greatest(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def split_script(self, script: str) -> list[str]:
        raise NotImplementedError

    def json_string(self, column: Any, key: str) -> Any:
        """SQL for ``column``'s top-level ``key`` when it is a JSON string, else NULL (change-feed listing)."""
        raise NotImplementedError

    def any_of(self, column: Any, name: str) -> Any:
        """``column`` equals one of the list bound as ``name`` (change-feed snapshot reads)."""
        raise NotImplementedError


class SqliteBackend(Backend):
    """Embedded default: one file, WAL, one writer at a time under ``BEGIN IMMEDIATE``."""

    name = "sqlite"
    migration_suffix = "sqlite"

    def configure(self, engine: Engine, *, readonly: bool, options: dict[str, str]) -> None:
        synchronous = options.get("synchronous", "FULL").upper()
        if synchronous not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError("synchronous must be one of OFF, NORMAL, FULL, EXTRA")
        busy_ms = int(options.get("busy_timeout_ms", "10000"))

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
            # Take transaction control away from pysqlite: it would only BEGIN at the first
            # INSERT/UPDATE/DELETE, leaving earlier reads of a "write" outside the write lock.
            dbapi_connection.isolation_level = None
            cur = dbapi_connection.cursor()
            cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cur.execute("PRAGMA foreign_keys = ON")
            if not readonly:
                mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    cur.execute("PRAGMA journal_mode = WAL")
            cur.execute(f"PRAGMA synchronous = {synchronous}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            # Straight to the driver (SQLAlchemy's per-statement machinery costs more than the BEGIN
            # itself on short transactions); errors are re-wrapped so busy still classifies as transient.
            sql = "BEGIN IMMEDIATE" if conn.get_execution_options().get("fencepost_write") else "BEGIN"
            try:
                conn.connection.driver_connection.execute(sql)  # type: ignore[union-attr]
            except sqlite3.Error as exc:
                raise DBAPIError.instance(sql, None, exc, sqlite3.Error, dialect=conn.dialect) from None

    def is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, DBAPIError):
            if exc.connection_invalidated:
                return True
            orig = exc.orig
            name = getattr(orig, "sqlite_errorname", None)
            return name in _SQLITE_TRANSIENT
        return False

    def classify(self, exc: BaseException) -> tuple[str, str | None]:
        orig = getattr(exc, "orig", None)
        name = getattr(orig, "sqlite_errorname", None)
        if name and name.startswith("SQLITE_CONSTRAINT"):
            return "constraint", name
        return "persistence_failed", name

    def insert(self, table: Any) -> Any:
        return sqlite_dialect.insert(table)

    def greatest(self, a: Any, b: Any) -> Any:
        return func.max(a, b)

    def any_of(self, column: Any, name: str) -> Any:
        return column.in_(bindparam(name, expanding=True))

    def json_string(self, column: Any, key: str) -> Any:
        path = literal("$." + key)
        return case((func.json_type(column, path) == "text", func.json_extract(column, path)), else_=None)

    def split_script(self, script: str) -> list[str]:
        statements: list[str] = []
        buffer = ""
        for line in script.splitlines(keepends=True):
            buffer += line
            if sqlite3.complete_statement(buffer):
                stmt = buffer.strip()
                if _strip_comments(stmt):
                    statements.append(stmt)
                buffer = ""
        if _strip_comments(buffer.strip()):
            raise ValueError("migration script ends with an incomplete statement")
        return statements


class PostgresBackend(Backend):
    """Scale-out backend: psycopg 3, tables in one schema, writers serialized per schema."""

    name = "postgresql"
    migration_suffix = "postgresql"

    def __init__(self, schema: str) -> None:
        if not SCHEMA_NAME.match(schema):
            raise ValueError("schema must match [a-z_][a-z0-9_]{0,62}")
        self.schema = schema

    def configure(self, engine: Engine, *, readonly: bool, options: dict[str, str]) -> None:
        schema = self.schema

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            # search_path is set per connection; the schema name was validated above.
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            dbapi_connection.execute(f'SET search_path TO "{schema}"')
            dbapi_connection.autocommit = autocommit

    def begin_write(self, conn: Connection) -> None:
        # One writer per schema, as upstream: revisions and journal positions are allocated
        # in commit order only because every write transaction takes this lock first.
        conn.execute(_PG_WRITE_LOCK, {"schema": self.schema})

    def read_options(self) -> dict[str, Any]:
        return {"isolation_level": "REPEATABLE READ", "postgresql_readonly": True}

    def is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, DBAPIError):
            if exc.connection_invalidated:
                return True
            code = getattr(exc.orig, "sqlstate", None)
            if code is None:
                # psycopg raises OperationalError without a sqlstate when the socket drops.
                return type(exc.orig).__name__ in {"OperationalError", "InterfaceError"}
            return code in _PG_TRANSIENT_CODES or code[:2] in _PG_TRANSIENT_CLASSES
        return False

    def classify(self, exc: BaseException) -> tuple[str, str | None]:
        code = getattr(getattr(exc, "orig", None), "sqlstate", None)
        if code and code.startswith("23"):
            return "constraint", code
        return "persistence_failed", code

    def insert(self, table: Any) -> Any:
        return pg_dialect.insert(table)

    def greatest(self, a: Any, b: Any) -> Any:
        return func.greatest(a, b)

    def any_of(self, column: Any, name: str) -> Any:
        # One array parameter: PostgreSQL parses and plans `IN` with 200 parameters ~5x slower.
        return column == func.any(bindparam(name, type_=pg_dialect.ARRAY(Text())))

    def json_string(self, column: Any, key: str) -> Any:
        doc = column.cast(pg_dialect.JSONB)
        field = doc.op("->")(literal(key))
        return case((func.jsonb_typeof(field) == "string", doc.op("->>", return_type=Text())(literal(key))), else_=None)

    def split_script(self, script: str) -> list[str]:
        # PostgreSQL accepts a whole script in one simple-protocol execute.
        return [script]


_PG_WRITE_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:schema, 2099))")


def _strip_comments(sql: str) -> str:
    return "\n".join(line for line in sql.splitlines() if not line.strip().startswith("--")).strip()
