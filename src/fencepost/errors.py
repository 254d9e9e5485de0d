"""The error tree: defects raise, contention is returned as an outcome.

Every message names a field, a rule, a limit or a length, never the rejected value,
because failure causes reach logs, spans and telemetry.
"""

from __future__ import annotations

from typing import Literal

RunStoreCode = Literal[
    "invalid_run",
    "decode_failed",
    "constraint",
    "not_found_row",
    "persistence_failed",
    # operator operations: a retry or delete the run's state does not allow
    "refused",
    # listing (upstream RunCatalogRead): bad options, a cursor that does not fit, a failed page
    "invalid_options",
    "invalid_cursor",
    "list_failed",
]
AttemptStoreCode = Literal[
    "invalid_attempt", "constraint", "decode_failed", "persistence_failed", "not_found_row", "unknown"
]
OpenCode = Literal[
    "not_a_database",
    "corrupt",
    "cannot_connect",
    "database_missing",
    "auth_failed",
    "permission_denied",
    "needs_migrations",
    "schema_too_new",
    "schema_mismatch",
    "migration_blocked",
    "disk_full",
    "driver_missing",
    "open_failed",
]
JournalCode = Literal[
    "invalid_event",
    "idempotency_conflict",
    "sequence_conflict",
    "fence_lost",
    "queue_overflow",
    "journal_closed",
    "sink_failed",
    "read_failed",
    "decode_failed",
    "projection_failed",
    "checkpoint_invalid",
    "reader_behind",
    "compacted",
    "persistence_failed",
    "constraint",
    "unknown",
]


class FencepostError(Exception):
    """Base class of every error fencepost raises on purpose."""

    code: str = "unknown"
    #: The name of the store that raised it, when a call across several named stores did
    #: (``merged_changes``, ``merged_follow``); ``None`` otherwise.
    store: str | None = None

    def __init__(self, code: str, method: str, detail: str) -> None:
        self.code = code
        self.method = method
        self.detail = detail
        super().__init__(f"{code}: {self.component}.{method}: {detail}")

    component = "fencepost"

    def __reduce__(self):  # keep errors picklable across worker processes
        # The attributes set after construction (``db_code``, ``store``, ``rotated`` ...) travel as
        # the instance's state.
        return (type(self), (self.code, self.method, self.detail), dict(self.__dict__))


class RunStoreError(FencepostError):
    """A run-store defect: invalid input, a corrupt row, a constraint or a database failure."""

    component = "RunStore"


class AttemptStoreError(FencepostError):
    """An attempt-store defect: invalid input, a corrupt row or a database failure."""

    component = "AttemptStore"


class JournalError(FencepostError):
    """A journal defect or a refused append (``fence_lost``, ``idempotency_conflict`` ...)."""

    component = "Journal"


class SourceChanged(RunStoreError):
    """A change-feed position or cursor belongs to another source, or is ahead of it: rebuild."""

    #: True when the position's source is not the store's current one (``rotate_source``, or
    #: another database at the same URL); False when it is ahead of the source, or the cause is other.
    rotated: bool = False

    def __init__(self, code: str = "invalid_run", method: str = "changesSince",
                 detail: str = "change cursor requires an explicit source rebuild") -> None:
        super().__init__(code, method, detail)


class ProjectionError(FencepostError):
    """A projection builder could not run (a second builder holds the name, a bad target ...)."""

    component = "Projection"
    #: True when ``run`` ended because the SQLite source file was replaced or removed at its path
    #: (``projection_failed``); ``store`` then names the source when the builder has several.
    source_replaced: bool = False
    #: Where the other builder applies the projection, when another process's builder holds its
    #: name (``builder_busy`` from acquiring it); ``None`` otherwise.
    target: str | None = None


class PersistenceError(FencepostError):
    """A database failure raised by the shared plumbing before a store has mapped it."""

    component = "Database"


class OpenError(FencepostError):
    """``fencepost.open`` could not open the store; ``code`` says why.

    Codes: ``not_a_database``, ``corrupt``, ``cannot_connect``, ``database_missing``, ``auth_failed``,
    ``permission_denied``, ``needs_migrations``, ``schema_too_new``, ``schema_mismatch``,
    ``migration_blocked`` (a pending migration could not take a lock another session held past the
    wait: nothing was applied, and ``transient`` is True), ``disk_full``,
    ``driver_missing`` (a PostgreSQL URL without the psycopg driver installed), and ``open_failed``
    for any other database failure. The message names the SQLite path or the
    PostgreSQL URL with its password masked, never other values; ``db_code`` is the driver's code when there is one
    (``SQLITE_NOTADB``, ``3D000`` ...; ``server_encoding`` for a PostgreSQL database whose encoding
    is not UTF8), else ``None``. ``transient`` is True when waiting may cure it, so the same open
    may succeed when retried: the server could not take a connection now (``cannot_connect``:
    nothing listening yet, no free connection slot, starting up or shutting down), or another
    session held a lock past the wait (``migration_blocked``, and ``open_failed`` naming it).
    """

    component = "Store"
    transient: bool = False

    def __init__(self, code: str, method: str, detail: str, db_code: str | None = None) -> None:
        super().__init__(code, method, detail)
        self.db_code = db_code

    def __reduce__(self):
        return (type(self), (self.code, self.method, self.detail, self.db_code), dict(self.__dict__))


def waiting_may_cure(exc: BaseException) -> bool:
    """Whether opening a store failed with ``exc`` in a way the same open may not meet when retried
    (an ``OpenError`` that is ``transient``): what the console and the worker wait out at start-up."""
    return isinstance(exc, OpenError) and exc.transient is True


class DatabaseMissing(OpenError):
    """A read-only open found no database (read commands never create one): ``database_missing``."""


class RunAlreadyExists(RunStoreError):
    """``create``/``create_many``/``retry`` met a run id that is already taken. Its code stays
    ``constraint`` (the run store's contract for a duplicate id); the class and the message say which
    constraint, so callers can ``except RunAlreadyExists``."""

    def __init__(self, code: str = "constraint", method: str = "create",
                 detail: str = "a run with this id already exists") -> None:
        super().__init__(code, method, detail)
