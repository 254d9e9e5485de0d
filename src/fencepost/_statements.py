"""Statements compiled once per dialect and run on the driver cursor of the open transaction.

Short transactions run a handful of tiny statements, where SQLAlchemy's per-call execution
machinery costs more than SQLite itself. A statement is declared once in Core (one definition for
both backends), compiled once per dialect to its SQL text, and executed on the pooled DBAPI
connection that the open ``Database.write``/``read`` transaction already holds. Driver errors are
re-wrapped as SQLAlchemy ``DBAPIError`` so the durable writer still classifies and retries them by
code. The run store, the change feed and the journal share this executor.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.exc import DBAPIError


class Sql:
    """A Core statement compiled lazily, once per dialect, to ``(text, default params)``.

    ``by_position``: on SQLite the statement is sent with ``?`` markers and its parameters as a
    tuple, taken from the caller's dict in the statement's order. sqlite3 looks a named marker up
    in the dict by a string it builds for every parameter of every execution, which on the
    journal's fourteen-column insert cost about a microsecond more than binding by position.

    ``fields``: the caller passes its parameters as a tuple of values in this order instead of a
    dict (no defaults allowed). On SQLite, when the statement's markers are in that order, the
    tuple goes to the driver as it is: a wide insert builds neither a dict nor a second tuple.
    """

    __slots__ = ("_compiled", "by_position", "fields", "stmt")

    def __init__(self, stmt: Any, *, by_position: bool = False, fields: tuple[str, ...] | None = None) -> None:
        self.stmt = stmt
        self.by_position = by_position
        self.fields = fields
        self._compiled: dict[str, tuple[str, dict[str, Any], Callable[[Any], Any] | None]] = {}

    def compiled(self, dialect_name: str) -> tuple[str, dict[str, Any]]:
        text_, defaults, _ = self.plan(dialect_name)
        return text_, defaults

    def plan(self, dialect_name: str) -> tuple[str, dict[str, Any], Callable[[Any], Any] | None]:
        """``(text, default params, how a params dict becomes the driver's parameters or None)``."""
        hit = self._compiled.get(dialect_name)
        if hit is None:
            hit = self._compiled[dialect_name] = _compile(self._statement(dialect_name), dialect_name,
                                                          by_position=self.by_position, fields=self.fields)
        return hit

    def _statement(self, dialect_name: str) -> Any:
        return self.stmt


def run(conn: Connection, q: Sql, params: dict[str, Any] | tuple[Any, ...] | None) -> Any:
    """Execute ``q`` with ``params`` on ``conn``'s open transaction; return the DBAPI cursor.

    ``params`` is a tuple in ``q.fields`` order when the statement declares ``fields``.

    ``params=None``: a statement without parameters, sent as it is (psycopg then runs several
    statements in one string).
    """
    dialect = conn.dialect
    # ``q.plan`` and ``_driver``, inline for the usual case: every statement of a write comes here.
    hit = q._compiled.get(dialect.name)
    text_, defaults, order = hit if hit is not None else q.plan(dialect.name)
    if defaults:
        # Never a tuple here: a statement taking a tuple has no defaults (``_compile`` refuses it).
        params = {**defaults, **cast("dict[str, Any]", params or {})}
    if order is not None:
        params = order(params)
    fairy = conn._dbapi_connection  # what ``conn.connection`` returns while the connection is open
    if fairy is not None and _PLAIN_DRIVER.get(type(dialect)):
        raw = fairy.dbapi_connection
    else:
        raw = _driver(conn, dialect)
    try:
        if (conn._has_events or conn.engine._has_events) and _observed(conn):
            return _run_observed(conn, raw, text_, params)
        return raw.execute(text_, params)  # type: ignore[union-attr]
    except dialect.loaded_dbapi.Error as exc:
        # Re-wrap so Database.write classifies (and retries) by driver code, as for Core calls.
        raise wrapped(dialect, exc) from None


def run_many(conn: Connection, q: Sql, rows: list[dict[str, Any]] | list[tuple[Any, ...]]) -> None:
    """Execute the DML statement ``q`` once per parameter set in ``rows`` (one driver call)."""
    dialect = conn.dialect
    text_, defaults, order = q.plan(dialect.name)
    if defaults:
        # Dicts here: a statement taking tuples has no defaults (``_compile`` refuses it).
        rows = [{**defaults, **cast("dict[str, Any]", r)} for r in rows]
    if order is not None:
        rows = [order(r) for r in rows]
    raw = _driver(conn, dialect)
    try:
        if _observed(conn):
            _run_observed(conn, raw, text_, rows, many=True)
            return
        cursor = raw.cursor()
        try:
            cursor.executemany(text_, rows)
        finally:
            cursor.close()
    except dialect.loaded_dbapi.Error as exc:
        raise wrapped(dialect, exc) from None


def wrapped(dialect: Dialect, exc: BaseException) -> BaseException:
    """``exc`` as SQLAlchemy wraps a driver error (``DBAPIError``, without SQL or parameters) when it
    is the driver's own, else ``exc`` itself.

    ``run`` hands the caller the driver's cursor, so a failure while its rows are fetched (SQLite
    decodes each TEXT value then: a value that is not UTF-8 fails there) reaches ``Database`` as
    the driver raised it; this is how it is wrapped there, as ``run`` wraps a failed execute.
    """
    error = dialect.loaded_dbapi.Error
    if isinstance(exc, error) and not isinstance(exc, DBAPIError):
        return DBAPIError.instance(None, None, exc, error, hide_parameters=True,
                                   dialect=dialect)
    return exc


# Dialect classes whose driver connection is the DBAPI connection itself (pysqlite, psycopg).
_PLAIN_DRIVER: dict[type, bool] = {}


def _driver(conn: Connection, dialect: Any) -> Any:
    """The driver connection under ``conn``: the pool proxy's ``dbapi_connection`` attribute when
    the dialect does not wrap it (read directly, not through two properties and a dialect call)."""
    fairy = conn.connection
    plain = _PLAIN_DRIVER.get(type(dialect))
    if plain is None:
        plain = _PLAIN_DRIVER[type(dialect)] = (
            type(dialect).get_driver_connection is DefaultDialect.get_driver_connection)
    return fairy.dbapi_connection if plain else fairy.driver_connection


def _observed(conn: Connection) -> bool:
    """Whether statement listeners are registered on ``conn`` or its engine.

    SQLAlchemy raises the connection's and the engine's ``_has_events`` flags when any connection
    event listener is added and checks them before every dispatch of its own; the same check
    first spares the listener lookups while nobody listens.
    """
    if not (conn._has_events or conn.engine._has_events):
        return False
    dispatch = conn.dispatch
    return bool(dispatch.before_cursor_execute or dispatch.after_cursor_execute)


def _run_observed(conn: Connection, raw: Any, text_: str, params: Any, *, many: bool = False) -> Any:
    """``run`` when statement listeners are registered (tracing, tests counting statements): they
    see these statements as they see SQLAlchemy's own (there is no execution context to give)."""
    cursor = raw.cursor()
    for fn in conn.dispatch.before_cursor_execute:
        text_, params = fn(conn, cursor, text_, params, None, many)
    if many:
        cursor.executemany(text_, params)
    else:
        cursor.execute(text_, params)
    conn.dispatch.after_cursor_execute(conn, cursor, text_, params, None, many)
    return cursor


class PerDialect(Sql):
    """A statement whose Core object differs per dialect: ``build(backend class)`` makes it (the ON
    CONFLICT inserts, from the backend's ``insert``; ``on_postgres`` for another form PostgreSQL is
    sent). ``stmt``: the portable form, where there is one, for statements built on it."""

    __slots__ = ("_build",)

    def __init__(self, build: Callable[[Any], Any], stmt: Any = None) -> None:
        super().__init__(stmt)
        self._build = build

    @classmethod
    def on_postgres(cls, stmt: Any, postgresql: Any) -> PerDialect:
        """``stmt``, sent to PostgreSQL as ``postgresql`` instead (where it is built says why)."""
        return cls(lambda backend: postgresql if backend.name == "postgresql" else stmt, stmt)

    def _statement(self, dialect_name: str) -> Any:
        from fencepost._dialects import backend_class  # compile time only; _dialects imports this module

        return self._build(backend_class(dialect_name))


def _compile(stmt: Any, dialect_name: str, *, by_position: bool = False, fields: tuple[str, ...] | None = None
             ) -> tuple[str, dict[str, Any], Callable[[Any], Any] | None]:
    """``(SQL text, default parameters, parameter order or None)`` of ``stmt`` for the dialect's driver.

    Integer constants the statement carries as anonymous parameters (``LIMIT 1``, the ``OFFSET 0``
    SQLite's compiler adds, a fixed key) are written into the text: nobody can pass them, and
    sending them with every execution cost a dict merge and a bind each (eight on the journal's
    head lookup).
    """
    from fencepost._dialects import backend_class  # compile time only; _dialects imports this module

    dialect = backend_class(dialect_name).driver_dialect
    if by_position and dialect.paramstyle == "named":
        dialect = type(dialect)(paramstyle="qmark")
    c = stmt.compile(dialect=dialect)
    required = {bp.key for bp in c.binds.values() if bp.required}
    defaults = {k: v for k, v in c.params.items() if k not in required}
    text_ = str(c)
    named = dialect.paramstyle == "named"
    if named or (dialect.paramstyle == "pyformat" and "%%" not in text_):
        for bp, name in c.bind_names.items():
            value = defaults.get(name)
            if not bp.unique or type(value) is not int or value < 0:  # ``-:p`` must not become ``--1``
                continue
            pattern = re.escape(f":{name}") + r"(?!\w)" if named else re.escape(f"%({name})s")
            text_ = re.sub(pattern, str(value), text_)
            del defaults[name]
    order: Callable[[Any], Any] | None = None
    names = c.positiontup or []
    if fields is not None:
        # Parameters come as a tuple of values in ``fields`` order.
        if defaults or set(fields) != required:
            raise ValueError("a statement taking its parameters as a tuple must name each one in fields")
        if dialect.paramstyle != "qmark":
            order = lambda t: dict(zip(fields, t, strict=True))  # noqa: E731
        elif list(names) != list(fields):
            at = [fields.index(n) for n in names]
            order = lambda t: tuple(t[i] for i in at)  # noqa: E731
        return text_, defaults, order
    if dialect.paramstyle == "qmark" and names:
        # ``itemgetter`` of one name returns the value itself, not a 1-tuple.
        order = operator.itemgetter(*names) if len(names) > 1 else (lambda p: tuple(p[n] for n in names))
    return text_, defaults, order
