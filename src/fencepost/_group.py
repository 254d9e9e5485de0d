"""Group commit: concurrent top-level writes of one process share one durable COMMIT.

A write call that finds no group open becomes the *leader*: it begins a write transaction on its
own connection (``BEGIN IMMEDIATE`` / the advisory lock, as a single write would), runs its own
body with no savepoint, then lets every call that is already waiting run its body on the same
connection, each in its own ``SAVEPOINT``, one at a time, and finally COMMITs once for all of them.
Every call is answered only after that COMMIT returned; a call whose body raised has had its
savepoint rolled back, so its refusal or failure is its own and the others still commit.

Each call keeps its single-call semantics:

* a body that raises gets its exception after the COMMIT (a driver error mapped to ``DbFailure``
  exactly as a single write maps it);
* a transient failure (busy, serialization, lost connection) in a body or at BEGIN re-runs that
  call as a single write, with its retries; a COMMIT the database definitely refused (busy, or a
  deferred constraint that some body broke) re-runs every call of the group alone, so the culprit
  fails alone: a body runs again only when nothing of it committed;
* a COMMIT whose outcome is unknown (the connection died during it) answers every call whose
  body succeeded with that failure, never retried; a call whose body raised in such a group is
  re-run alone, since what it saw may not have committed;
* ``after_commit`` callbacks run in the calling thread, after the COMMIT, for calls that succeeded.

Bodies run in their own threads (so thread-locals, context variables and exceptions stay theirs);
the group lock makes sure only one of them uses the shared connection at a time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

if TYPE_CHECKING:
    from fencepost._durable import Database

T = TypeVar("T")

MAX_MEMBERS = 64  # calls per shared transaction
_GATHER_WAIT = 0.002  # seconds the leader waits at a time for a waiting call to take its turn

_OK, _RAISED, _ALONE = "ok", "raised", "alone"


class _Group:
    __slots__ = ("conn", "done", "failure", "members", "trans")

    def __init__(self, conn: Connection, trans: Any) -> None:
        self.conn = conn
        self.trans = trans
        self.members = 1
        self.done = False
        # Set when the group ends without a definite commit: ``"alone"`` re-runs the members alone;
        # a DbFailure is the commit-unknown answer of the members whose body succeeded.
        self.failure: Any = None


class GroupCommit:
    """The group-commit writer of one ``Database`` (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._waiting_lock = threading.Lock()
        self._waiting = 0  # calls blocked on the group lock, about to join or lead
        self._group: _Group | None = None

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` as a top-level write, sharing the COMMIT with concurrent calls."""
        if self._pid != os.getpid():
            self._reset()  # a forked child: the parent's locks and group are not ours
        with self._waiting_lock:
            self._waiting += 1
        entered = False
        try:
            with self._cond:
                with self._waiting_lock:
                    self._waiting -= 1
                entered = True
                group = self._group
                if group is None or group.members >= MAX_MEMBERS:
                    outcome = self._lead(fn)
                else:
                    outcome = self._follow(group, fn)
        finally:
            if not entered:
                with self._waiting_lock:
                    self._waiting -= 1
        return self._answer(fn, outcome)

    # ------------------------------------------------------------------ leader
    def _lead(self, fn: Callable[[Connection], Any]) -> tuple[str, Any, list[Callable[[], None]]]:
        """Holding the group lock: open a group, run ``fn``, let waiting calls join, COMMIT."""
        while self._group is not None:  # a full group still committing: wait for it to end
            self._cond.wait(_GATHER_WAIT)
        db = self._db
        slot = db._slot(True)
        with slot.lock:
            if slot.conn.closed:
                return (_ALONE, None, [])
            conn = slot.conn
            trans = None
            try:
                trans = conn.begin()
                db.backend.begin_write(conn)
            except BaseException as exc:
                db._settle(conn, trans, True, exc)
                return self._raised(exc)  # as a single write: busy retries, anything else is this call's
            group = _Group(conn, trans)
            self._group = group
            try:
                outcome = self._run_body(conn, fn, savepoint=False)
                if outcome[0] != _OK:
                    # Nobody joined yet: the transaction holds only this body. Roll it back.
                    db._settle(conn, trans, True, getattr(outcome[1], "raw", None))
                    return outcome
                while not group.failure:
                    with self._waiting_lock:
                        waiting = self._waiting
                    if waiting == 0 or group.members >= MAX_MEMBERS:
                        break
                    self._cond.wait(_GATHER_WAIT)  # a waiting call takes the lock and runs its body
                self._group = None
                if group.failure:  # a member broke the shared transaction: nothing of it commits
                    db._settle(conn, trans, True, None)
                    return (_ALONE, None, [])
                try:
                    trans.commit()
                except BaseException as exc:
                    db._settle(conn, trans, True, exc)
                    if _refused(db, exc):
                        # Definitely not committed (busy, or a deferred constraint some body broke):
                        # every call runs again alone, so the culprit fails alone.
                        group.failure = _ALONE
                        return (_ALONE, None, [])
                    # The outcome is unknown: no member whose body succeeded may run again.
                    group.failure = db._failure(exc) if isinstance(exc, SQLAlchemyError) else _unknown()
                    return (_RAISED, group.failure if isinstance(exc, SQLAlchemyError) else exc, [])
                return outcome
            finally:
                self._group = None if self._group is group else self._group
                group.done = True
                self._cond.notify_all()

    # ------------------------------------------------------------------ follower
    def _follow(self, group: _Group, fn: Callable[[Connection], Any]) -> tuple[str, Any, list[Callable[[], None]]]:
        """Holding the group lock: run ``fn`` in a savepoint of ``group``, wait for its COMMIT."""
        group.members += 1
        outcome = self._run_body(group.conn, fn, savepoint=True)
        if outcome[0] == _ALONE and outcome[1] == "broken":
            group.failure = _ALONE
        self._cond.notify_all()
        while not group.done:
            self._cond.wait()
        if group.failure is None:
            return outcome
        if group.failure == _ALONE:
            return (_ALONE, None, [])
        if outcome[0] == _OK:
            return (_RAISED, group.failure, [])  # the commit outcome is unknown: never re-run
        return (_ALONE, None, [])  # what this body saw may not have committed: decide again alone

    # ------------------------------------------------------------------ one body
    def _run_body(self, conn: Connection, fn: Callable[[Connection], Any], *, savepoint: bool
                  ) -> tuple[str, Any, list[Callable[[], None]]]:
        """Run ``fn`` with this thread's transaction context; ``(kind, value, after_commit)``."""
        from fencepost._durable import _current, _Txn

        db = self._db
        txn = _Txn(conn, True)
        active = dict(_current.get() or {})
        active[id(db)] = txn
        token = _current.set(active)
        try:
            if savepoint:
                nested = conn.begin_nested()
                try:
                    result = fn(conn)
                except BaseException as exc:
                    try:
                        if nested.is_active:
                            nested.rollback()
                    except BaseException:
                        return (_ALONE, "broken", [])  # the shared transaction is unusable now
                    return self._raised(exc)
                try:
                    nested.commit()  # RELEASE SAVEPOINT
                except BaseException:
                    return (_ALONE, "broken", [])
            else:
                result = fn(conn)
        except BaseException as exc:
            return self._raised(exc)
        finally:
            _current.reset(token)
        return (_OK, result, txn.after_commit)

    def _raised(self, exc: BaseException) -> tuple[str, Any, list[Callable[[], None]]]:
        """How a raising body is answered: as a single write would answer it."""
        db = self._db
        if isinstance(exc, DBAPIError):
            if exc.connection_invalidated or db.backend.is_transient(exc):
                return (_ALONE, "broken", [])  # the single write would retry: so do we, alone
            failure = db._failure(exc)
            failure.raw = exc  # type: ignore[attr-defined]  # settle needs it to replace a stale connection
            return (_RAISED, failure, [])
        if isinstance(exc, SQLAlchemyError):
            return (_RAISED, db._failure(exc), [])
        return (_RAISED, exc, [])

    # ------------------------------------------------------------------ the answer
    def _answer(self, fn: Callable[[Connection], T], outcome: tuple[str, Any, list[Callable[[], None]]]) -> T:
        kind, value, callbacks = outcome
        if kind == _ALONE:
            return self._db._run(fn, write=True)
        if kind == _RAISED:
            raise value
        for callback in callbacks:
            callback()
        return value  # type: ignore[no-any-return]


def _refused(db: Database, exc: BaseException) -> bool:
    """Whether a failed COMMIT certainly committed nothing: the database answered with a refusal
    (busy or serialization, or a deferred constraint) on a connection that is still there."""
    if not isinstance(exc, DBAPIError) or exc.connection_invalidated:
        return False
    return db.backend.is_transient(exc) or db._failure(exc).category == "constraint"


def _unknown() -> Any:
    from fencepost._durable import DbFailure

    return DbFailure("persistence_failed", None)
