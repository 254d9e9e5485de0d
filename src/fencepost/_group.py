"""Group commit: concurrent top-level writes of one process share one durable COMMIT.

A write call that finds nobody leading becomes the *leader*. It begins a write transaction on its
own connection (``BEGIN IMMEDIATE`` / the advisory lock, as a single write would) and runs its own
body. Calls arriving meanwhile do not touch the database: they queue their body and wait. The
leader then runs every queued body itself, one after the other on the same connection, each
behind its own savepoint and inside a copy of its caller's context (so context variables, the
transaction the body sees, and spans are the caller's), and finally COMMITs once for all of them.
After that COMMIT it answers each caller and hands the lead to the first call still queued.

Running the bodies in the leader's thread is what makes the sharing cheap: a queued call costs a
wake-up when it is answered, never a thread switch per statement.

Each call keeps its single-call semantics:

* a body that raises gets its exception after the COMMIT, in the calling thread (a driver error
  mapped to ``DbFailure`` exactly as a single write maps it); its savepoint was rolled back, so
  its refusal or failure is its own and the others still commit;
* a transient failure (busy, serialization, lost connection) in a body or at BEGIN re-runs that
  call as a single write, with its retries, unless the leader's BEGIN (or new connection) already
  waited the store's whole wait (``busy_timeout_ms``, ``connect_timeout``): then the leader and
  every call queued behind it fail at once, transient; a COMMIT the database definitely refused (busy, or a
  deferred constraint that some body broke) re-runs every call of the group alone, so the culprit
  fails alone: a body runs again only when nothing of it committed;
* a COMMIT whose outcome is unknown (the connection died during it) answers every call whose
  body succeeded with that failure, never retried; a call whose body raised in such a group is
  re-run alone, since what it saw may not have committed;
* ``after_commit`` callbacks run in the calling thread, after the COMMIT, for calls that succeeded.

A call made while its thread or task already has a transaction open (on any store) writes alone:
its body may use that other transaction's connection, which belongs to the caller's thread.

A body that raises a ``BaseException`` other than ``KeyboardInterrupt`` (``SystemExit``, an
exception class of the caller's own) is that call's outcome like any other: rolled back to its
savepoint and raised in the calling thread. A ``KeyboardInterrupt`` raised in the leader's thread
(Ctrl-C reaches the main thread, whatever body it is running) is the leader's: the group ends.

A body that leaves the transaction aborted (PostgreSQL: a failed statement it caught) fails that
call alone, rolled back to its savepoint: a COMMIT would have rolled back everything.

A queued caller interrupted while it waits (Ctrl-C) leaves the queue if its body has not started;
a started body is answered to nobody but still counts as written (as an interrupted single write
whose COMMIT was already sent). The lead is never stranded: an interrupted caller that was just
handed the lead passes it on, and a leader interrupted anywhere (even as it answers its group)
drops or passes the lead and answers every call it took, each once: with its own outcome once
the COMMIT succeeded, never by running a committed body again.

A write made on a thread whose own call is queued or was just handed the lead (a signal handler
that writes) runs alone rather than queue behind a call that cannot go on until it returns; one
made on a thread that is leading a group outside any body fails at once (it could only wait for
itself).
"""

from __future__ import annotations

import contextvars
import threading
import time
from _thread import get_ident
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from fencepost._statements import wrapped
from fencepost._txn import PROCESS, Txn, current

if TYPE_CHECKING:
    from fencepost._durable import Database

T = TypeVar("T")

# Calls per shared transaction. Each member is a savepoint; PostgreSQL keeps up to 64
# subtransactions of a session in shared memory before it overflows to disk, so stay well below.
MAX_MEMBERS = 32

_OK, _RAISED, _ALONE = "ok", "raised", "alone"
_SAVEPOINT = "SAVEPOINT fencepost_member"
_ROLLBACK_TO = "ROLLBACK TO SAVEPOINT fencepost_member"
_RELEASE = "RELEASE SAVEPOINT fencepost_member"

# States of a queued call.
_QUEUED, _TAKEN, _LEAD, _ANSWERED = 0, 1, 2, 3

# How far a group's COMMIT got (``GroupCommit._stage``), which says how a taken call that nothing
# answered yet (the leader was interrupted) is answered: run alone (nothing of the group committed),
# its success turned into an unknown outcome (the COMMIT was sent), or its own outcome (final).
_NOT_SENT, _SENT, _FINAL = 0, 1, 2

# PostgreSQL's transaction status of a session whose transaction a failed statement aborted
# (``psycopg.pq.TransactionStatus.INERROR``).
_PG_INERROR = 3

Outcome = tuple[str, Any, list[Callable[[], None]]]
#: "Run it as a single write": the outcome of a call nothing answered otherwise (shared: its
#: callback list is never read).
_RUN_ALONE: Outcome = (_ALONE, None, [])


class _Wake:
    """A one-shot wake-up for a queued call: ``wait`` blocks until ``set``, which is called once.

    A bare lock, held from birth and released by ``set``: about a seventh of what a
    ``threading.Event`` costs to make, set and wait on, and its wait is interrupted by Ctrl-C the
    same way (an Event waits on such a lock too).
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        self._lock.release()

    def wait(self) -> None:
        self._lock.acquire()


_new_event = _Wake  # how a queued call waits (a test interrupts the wait through it)


class _MarkedLock:
    """The group's lock, and which thread is taking or holding it (a thread-local mark).

    A signal handler (or finalizer) that writes can run on a thread in the middle of its own call,
    while that call holds the lock: waiting for it there would wait for ever, so ``write`` asks
    ``mine()`` first and refuses such a call at once. The mark is set before the lock is taken and
    cleared after it is released, so no moment of holding it goes unmarked (a moment around it may
    be marked: such a call is refused where it could, barely, have waited)."""

    __slots__ = ("_local", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()

    def __enter__(self) -> None:
        self._local.held = True
        try:
            self._lock.acquire()
        except BaseException:  # interrupted while waiting: not held
            self._local.held = False
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self._lock.release()
        finally:
            self._local.held = False

    def mine(self) -> bool:
        return getattr(self._local, "held", False)


class _Call:
    """One queued write call: its body, its caller's context, and (once answered) its outcome."""

    __slots__ = ("context", "event", "fn", "ident", "outcome", "state")

    def __init__(self, fn: Callable[[Connection], Any], ident: int) -> None:
        self.fn = fn
        self.ident = ident  # the calling thread
        self.context = contextvars.copy_context()
        self.state = _QUEUED
        self.outcome: Outcome = _RUN_ALONE
        self.event = _new_event()


class _Broken(Exception):
    """The shared transaction cannot go on (a savepoint could not be rolled back)."""


class GroupCommit:
    """The group-commit writer of one ``Database`` (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        # Whether a body can leave the transaction aborted (PostgreSQL): asked after each body.
        self._pg = db.path is None
        self._reset()

    def _reset(self) -> None:
        self._lock = _MarkedLock()
        self._queue: deque[_Call] = deque()
        self._leading = False
        # Calls the last group took besides its leader's own: how many are likely to come back.
        self._last_members = 0
        # The connection of the group transaction while one is open (tests watch it).
        self._group: Connection | None = None
        # The thread running the lead (its ident), and the queued call the lead was last handed
        # to (until it wakes to run it): a call made on either thread must not queue behind it.
        self._leader: int | None = None
        self._handed: _Call | None = None
        self._stage = _NOT_SENT
        self._pid = PROCESS.pid  # last: in a forked child, other threads go on once it is set

    @property
    def _waiting(self) -> int:
        """Calls queued for a group, their bodies not yet started."""
        return len(self._queue)

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` as a top-level write, sharing the COMMIT with concurrent calls."""
        if self._pid != PROCESS.pid:
            PROCESS.adopt(self, self._reset)  # a forked child: the parent's locks and queue are not ours
        if current.get():
            return self._db._run(fn, write=True)
        if self._lock.mine():
            raise own_call_in_progress(True)  # made in the middle of this thread's own call, lock held
        # The call's wait for a lock counts from here, whoever's BEGIN it waited at (its own as a
        # leader, a leader's while queued, its own again when run alone): see ``_waited_out``.
        started = time.monotonic()
        call: _Call | None = None  # only a call that queues needs one (a leader answers itself)
        outcome = _RUN_ALONE
        taken: list[_Call] = []
        leading = False
        # One try from the first step on: an interrupt (Ctrl-C) wherever it lands leaves neither a
        # queued body behind nor the lead stranded (every later write would wait for it forever).
        try:
            try:
                with self._lock:
                    if self._leading:
                        me = get_ident()
                        beside = self._beside_own(me)  # this thread's own call may be in the group
                        if beside is None:
                            call = _Call(fn, me)
                            self._queue.append(call)
                        else:
                            outcome = beside
                    else:
                        self._leading = leading = True
                        self._leader = get_ident()
                if call is not None:
                    call.event.wait()
                    leading = call.state == _LEAD  # handed the lead: lead the next group
                    outcome = call.outcome
                    if leading:
                        self._leader = call.ident
                        self._handed = None
                if leading:
                    if self._last_members:
                        self._gather()
                    outcome = self._run_group(fn, taken, started)
            except BaseException:
                if call is not None:
                    with self._lock:
                        if call.state == _LEAD:
                            leading = True  # handed the lead as the interrupt came: pass it on below
                        elif call.state == _QUEUED and not leading and call in self._queue:
                            self._queue.remove(call)  # its body never runs
                        call.state = _ANSWERED
                raise
        finally:
            if leading:
                self._end_group(taken)
        kind, value, callbacks = outcome
        if kind is _OK:  # the usual answer, without a call for it
            for callback in callbacks:
                callback()
            return value
        return self._answer(fn, outcome, started)

    def _beside_own(self, me: int) -> Outcome | None:
        """Holding ``_lock``, the lead taken: the outcome of a new call made on thread ``me`` when
        that thread already has a call in the group, else None (the call queues).

        Only code that ran in the middle of that call (a signal handler, a finalizer) can make one.
        Queued behind it, or behind the lead just handed to it, the new call would wait for a call
        that cannot go on until the new one returns: it writes alone instead. A thread leading a
        group outside any body (a body's own writes nest in the group's transaction) holds the
        transaction the new call would wait for: it fails at once."""
        if self._leader == me:
            return (_RAISED, own_call_in_progress(True), [])
        handed = self._handed
        if (handed is not None and handed.ident == me and handed.state == _LEAD) \
                or any(queued.ident == me for queued in self._queue):
            return _RUN_ALONE
        return None

    def _gather(self) -> None:
        """Before a group begins, let the callers the last group answered queue again.

        Answered callers return to their own code and come back with their next write. Started
        while they are still on their way, the group would hand the interpreter lock back and
        forth with them at every statement it sends; yielding it up to once per expected caller
        lets them queue first, so the group runs uncontended and takes them all. A process with
        one writing thread never yields (the last group took nobody else).
        """
        expected = self._last_members
        for _ in range(expected):
            if len(self._queue) >= expected:
                return
            time.sleep(0)

    def _pass_lead(self) -> None:
        """Holding ``_lock``: hand the lead to the first queued call, or drop it."""
        if self._queue:
            nxt = self._queue.popleft()
            nxt.state = _LEAD
            self._leader = None
            self._handed = nxt
            nxt.event.set()
        else:
            self._leading = False

    # ------------------------------------------------------------------ leader
    def _end_group(self, taken: list[_Call]) -> None:
        """After leading: answer any call the group took but did not answer, pass the lead on.

        Runs in the ``finally`` of ``write``, also when an interrupt (Ctrl-C) ended the group
        anywhere, this included: the lead is dropped or passed whatever happens before."""
        try:
            if taken:
                # Whatever ended the group early: how far its COMMIT got says how (``_answer_all``).
                self._answer_all(taken, self._stage)
            self._last_members = len(taken)
        finally:
            self._stage = _NOT_SENT
            with self._lock:
                if self._queue:
                    self._pass_lead()
                else:  # the lone writer's usual case, without the call
                    self._leading = False

    def _run_group(self, fn: Callable[[Connection], Any], taken: list[_Call], began: float) -> Outcome:
        """Lead one group: run ``fn``, then the queued bodies (into ``taken``), COMMIT, answer.
        ``began``: when the leader's call began (any wait in the queue counts toward its lock wait)."""
        db = self._db
        try:
            slot = db._slot(True)
        except SQLAlchemyError as exc:
            # Cannot connect: a single write retries and maps it, unless the wait is already spent.
            return self._waited_out(exc, began) or _RUN_ALONE
        with slot.lock:
            if slot.reclaimed or slot.conn.closed:  # taken back or closed between the lookup and the lock
                return _RUN_ALONE
            conn = slot.conn
            trans = None
            try:
                trans = conn.begin()
                db.backend.begin_write(conn)
            except BaseException as exc:
                db._settle(conn, trans, True, exc)
                # As a single write: busy retries (unless the wait is already spent), anything else
                # is this call's.
                return self._waited_out(exc, began) or self._raised(exc)
            self._group = conn
            committing = False
            try:
                raw = conn.connection.dbapi_connection
                txn = Txn(conn, True)
                try:
                    # Set inside the ``try`` whose ``finally`` clears it: an interrupt just after
                    # must not leave this thread marked as inside a transaction.
                    current.set({id(db): txn})
                    own = (_OK, fn(conn), txn.after_commit)  # ``_body``, inline: the lone writer's path
                except Exception as exc:
                    own = self._raised(exc)
                finally:
                    current.set(None)  # ``write`` found none set
                if own[0] == _OK and self._pg and aborted(raw):
                    own = (_RAISED, aborted_failure(), [])
                if own[0] != _OK:
                    # Nobody joined yet: the transaction holds only this body. Roll it back.
                    db._settle(conn, trans, True, getattr(own[1], "raw", None))
                    return own
                # Nobody queued (a lone writer, the usual case): straight to the COMMIT. A call that
                # queues just after this look waits for the lead, as one queuing after the COMMIT.
                if self._queue and not self._take_members(conn, raw, taken):
                    db._settle(conn, trans, True, None)
                    return _RUN_ALONE  # the finally answers every taken call: run alone
                committing = True
                self._stage = _SENT  # from here on, no body that succeeded runs again
                try:
                    trans.commit()
                except BaseException as exc:
                    db._settle(conn, trans, True, exc)
                    if _refused(db, exc):
                        # Definitely not committed (busy, or a deferred constraint some body broke):
                        # every call runs again alone, so the culprit fails alone.
                        self._stage = _NOT_SENT
                        return _RUN_ALONE
                    # The outcome is unknown: no member whose body succeeded may run again.
                    unknown = db._failure(exc, at_commit=True) if isinstance(exc, SQLAlchemyError) \
                        else _unknown(_INTERRUPTED)
                    for call in taken:
                        call.outcome = (_RAISED, unknown, []) if call.outcome[0] == _OK else _RUN_ALONE
                    self._stage = _FINAL
                    self._answer_all(taken)
                    if isinstance(exc, SQLAlchemyError):
                        return (_RAISED, unknown, [])
                    raise
                self._stage = _FINAL
                if taken:
                    self._answer_all(taken)
                return own
            except BaseException:
                if not committing:
                    db._settle(conn, trans, True, None)
                raise
            finally:
                self._group = None

    def _take_members(self, conn: Connection, raw: Any, taken: list[_Call]) -> bool:
        """Run the queued bodies (into ``taken``) in the open group transaction, each behind its
        savepoint; False when the transaction cannot go on (a savepoint could not be rolled back).
        ``raw``: the driver connection of ``conn``."""
        # A member's savepoint is released just before the next member's is set (one round trip
        # where the driver joins statements); COMMIT releases the last one.
        open_only: tuple[str, ...] = (_SAVEPOINT,)
        release_then_open = ((f"{_RELEASE}; {_SAVEPOINT}",) if self._db.backend.joins_statements
                             else (_RELEASE, _SAVEPOINT))
        opening = open_only
        try:
            while len(taken) + 1 < MAX_MEMBERS:
                with self._lock:
                    if not self._queue:
                        break
                    call = self._queue.popleft()
                    call.state = _TAKEN
                    taken.append(call)
                call.outcome = call.context.run(self._member, conn, raw, call.fn, opening)
                held = call.outcome[0] == _OK  # a failed member's savepoint is already gone
                opening = release_then_open if held else open_only
        except _Broken:
            return False
        return True

    def _answer_all(self, taken: list[_Call], stage: int = _FINAL) -> None:
        """Wake every taken call not yet answered. ``stage`` says with what: its own outcome
        (``_FINAL``); "run alone" (``_NOT_SENT``: nothing of the group committed); or, the COMMIT
        sent but its outcome unknown (``_SENT``: the leader was interrupted), an unknown outcome
        for a body that succeeded and "run alone" for one that raised (nothing of it was kept).

        A call is marked answered only after its wake-up: an interrupt landing in between leaves it
        to the next ``_answer_all`` (``_end_group``'s), which wakes it again, harmlessly, rather
        than leave it waiting forever; only calls nobody woke yet get a ``stage`` other than final."""
        with self._lock:
            for call in taken:
                if call.state == _TAKEN:
                    if stage != _FINAL:
                        call.outcome = _RUN_ALONE if stage == _NOT_SENT or call.outcome[0] != _OK \
                            else (_RAISED, _unknown(_INTERRUPTED), [])
                    _wake(call)
                    call.state = _ANSWERED

    # ------------------------------------------------------------------ one body
    def _member(self, conn: Connection, raw: Any, fn: Callable[[Connection], Any],
                opening: tuple[str, ...]) -> Outcome:
        """Run a queued body behind its savepoint, in its caller's context (``Context.run``).

        ``opening`` are the statements that set the savepoint (the previous member's release
        first, when it left one). A body that succeeded leaves its savepoint for the next opening
        or the COMMIT to release; a failed one is rolled back to it and released here.
        """
        try:
            for statement in opening:
                raw.execute(statement)
        except Exception as exc:
            raise _Broken from exc
        txn = Txn(conn, True)
        current.set({id(self._db): txn})
        outcome = self._body(conn, fn, txn)
        if outcome[0] == _OK and self._pg and aborted(raw):
            outcome = (_RAISED, aborted_failure(), [])  # its savepoint's rollback ends the abort
        if outcome[0] != _OK:
            try:
                raw.execute(_ROLLBACK_TO)  # undoes this body only
                raw.execute(_RELEASE)
            except Exception as exc:
                raise _Broken from exc
        return outcome

    def _body(self, conn: Connection, fn: Callable[[Connection], Any], txn: Any) -> Outcome:
        try:
            result = fn(conn)
        except KeyboardInterrupt:
            raise  # Ctrl-C reached the leader's thread: the leader's, whatever body it ran
        except BaseException as exc:  # ``SystemExit`` and the like: the caller's own, as any error
            return self._raised(exc)
        return (_OK, result, txn.after_commit)

    def _raised(self, exc: BaseException) -> Outcome:
        """How a raising body is answered: as a single write would answer it."""
        db = self._db
        exc = wrapped(db.engine.dialect, exc)  # a driver error raised while the body fetched rows
        if isinstance(exc, DBAPIError):
            if exc.connection_invalidated or db.backend.is_transient(exc):
                return _RUN_ALONE  # the single write would retry: so do we, alone
            failure = db._failure(exc)
            failure.raw = exc  # type: ignore[attr-defined]  # settle needs it to replace a stale connection
            return (_RAISED, failure, [])
        if isinstance(exc, SQLAlchemyError):
            return (_RAISED, db._failure(exc), [])
        return (_RAISED, exc, [])

    def _waited_out(self, exc: BaseException, began: float) -> Outcome | None:
        """The leader's own first attempt (its connection, its BEGIN) failed with ``exc``, ``began``
        being when it started: the failure as the call's answer when it is transient but already
        spent the store's whole wait for a lock (SQLite busy after ``busy_timeout_ms``), as a single
        write's first attempt would answer it; else None. Run again alone, the call would wait the
        same budget a second time.

        The calls queued behind the leader meanwhile get the same failure (each its own), their
        bodies never started: each of them, leading in turn, would wait the whole budget again for
        the lock (or the server) the leader just waited out, so the last of N queued calls would
        fail only after N budgets."""
        db = self._db
        if isinstance(exc, Exception):
            exc = wrapped(db.engine.dialect, exc)
        if isinstance(exc, DBAPIError) and db.backend.is_transient(exc) \
                and db.backend.waited_out(exc, time.monotonic() - began):
            with self._lock:
                queued = list(self._queue)
                self._queue.clear()
            for call in queued:
                call.outcome = (_RAISED, db._failure(exc), [])
            with self._lock:
                for call in queued:
                    call.state = _ANSWERED
                    call.event.set()
            return (_RAISED, db._failure(exc), [])
        return None

    # ------------------------------------------------------------------ the answer
    def _answer(self, fn: Callable[[Connection], T], outcome: Outcome, started: float) -> T:
        kind, value, callbacks = outcome
        if kind == _ALONE:
            return self._db._run(fn, write=True, started=started)
        if kind == _RAISED:
            raise value
        for callback in callbacks:
            callback()
        return value


def _refused(db: Database, exc: BaseException) -> bool:
    """Whether a failed COMMIT certainly committed nothing: the database answered with a refusal
    (busy or serialization, or a deferred constraint) on a connection that is still there, or
    ended the session after rolling the transaction back (PostgreSQL's idle-in-transaction
    timeout: a lost connection whose outcome is known)."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return db.backend.is_transient(exc) and not db.backend.commit_unknown(exc)
    return db.backend.is_transient(exc) or db._failure(exc).category == "constraint"


def _unknown(reason: str) -> Any:
    """The failure of a COMMIT interrupted by something other than the driver: its outcome is unknown."""
    from fencepost._durable import DbFailure

    return DbFailure("persistence_failed", None, reason)


# Why a member of a group whose COMMIT the leader's thread was interrupted in (Ctrl-C) is not told
# its outcome: not the connection's fault, nor the disk's.
_INTERRUPTED = ("the COMMIT this write shared with other calls of the process was interrupted (Ctrl-C in "
                "the thread that ran it), so the write may have committed: check before repeating it")

#: The reason of a write whose transaction a failed statement aborted (see ``aborted``).
ABORTED = ("the transaction was aborted by a failed statement (one the callback caught and went on "
           "after), so nothing of it was committed")


def aborted(raw: Any) -> bool:
    """Whether the driver connection ``raw`` is in a transaction a failed statement aborted
    (PostgreSQL only: its COMMIT would roll back every statement). An attribute read."""
    pgconn = getattr(raw, "pgconn", None)
    return pgconn is not None and pgconn.transaction_status == _PG_INERROR


def aborted_failure() -> Any:
    """The failure of a write whose transaction a failed statement aborted: never retried (the
    same callback would do the same again)."""
    from fencepost._durable import DbFailure

    return DbFailure("persistence_failed", "25P02", ABORTED)


def own_call_in_progress(write: bool, *, nested: bool = False) -> Any:
    """The failure of a call made on a thread in the middle of its own write (``write``) or read on
    the same store (a signal handler, a finalizer), where that call is not running its body (its
    transaction begins or commits, or a statement waits for the server): it cannot wait for that
    call, which waits for it. ``nested``: a read made there (else the new call is of the same kind)."""
    from fencepost._durable import DbFailure

    own = "write" if write else "read"
    made = "read" if nested else own
    return DbFailure("persistence_failed", None,
                     f"a {made} was made on a thread while its own {own} was in progress (from a signal "
                     f"handler or a finalizer?): it cannot wait for that {own}, which waits for it")


def _wake(call: _Call) -> None:
    """Wake ``call``; a second wake-up (after an interrupt landed between the first and marking it
    answered) is harmless."""
    try:
        call.event.set()
    except RuntimeError:  # already woken and not yet waiting again: its lock is free
        pass
