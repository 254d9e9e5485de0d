"""A worker: sweep for claimable runs, take them with the two-phase claim, run a function under
supervision, checkpoint, honour cancellation and settle.

Several workers (threads or processes, on one host or many) may share one database: every step that
decides who runs what is a compare-and-swap in the run store, so a lost race is an outcome the worker
simply skips, never a second execution. What the worker adds on top of the store:

- **Finding work.** ``pending`` and ``suspended`` runs without a claim; ``running`` runs whose lease
  expired and whose owner a liveness check calls gone (taken with ``steal`` plus evidence, then
  ``activate``); and claims left by a claimant that died between claim and activate
  (``recover_claim``, after which they are ordinary candidates again).
- **Keeping leases.** One ``Supervisor`` renews every run the worker holds with one
  ``runs.heartbeat_many`` per ``HEARTBEAT_INTERVAL``.
- **Cancellation.** Once per interval the worker reads the cancel requests of the runs it holds,
  acknowledges them (``acknowledge_cancel``) and flags the run's context; the function sees
  ``Cancelled`` at its next ``check()`` or ``checkpoint()``. A run is settled ``cancelled`` only
  under the ``present`` guard, and ``completed`` only under the ``absent`` guard, so a request that
  races the finish is never lost.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import random
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, NoReturn

import msgspec
from sqlalchemy import and_, func, select

from fencepost import _gauges
from fencepost._dialects import FILE_REPLACED
from fencepost._durable import COMMIT_UNKNOWN, DbFailure, map_failure
from fencepost._printable import one_line
from fencepost._schema import flows_runs as runs_t
from fencepost._values import REPEATED_KEY, SAFE_MAX, identifier_problem, parse_json_text, stop_problem
from fencepost.changefeed.types import StopSignal
from fencepost.clock import Steady
from fencepost.errors import FencepostError, RunStoreError
from fencepost.journal.owner import OwnerId, owner_problem
from fencepost.runstore._tracebacks import logged_traceback, store_redaction
from fencepost.runstore.heartbeat import HEARTBEAT_INTERVAL_MS as INTERVAL_MS
from fencepost.runstore.heartbeat import STALE_AFTER_MS as STALE_MS
from fencepost.runstore.heartbeat import WRITE_TOLERANCE_MS as TOLERANCE_MS
from fencepost.runstore.liveness import LivenessCheck, LivenessContext, lease_liveness, same_host_pid_probe
from fencepost.runstore.outcomes import Activated, Claimed, FenceLost, GuardFailed, Recovered, Transitioned
from fencepost.runstore.ownership import Lease, LeaseLost, Supervisor
from fencepost.runstore.rows import LivenessEvidence, RunFailure, RunRow, RunSnapshot
from fencepost.shards.supervision import ShardSupervisor

__all__ = ["MEMBER_WAIT_S", "STOP_GRACE_S", "SUSPEND_BACKOFF_S", "Cancelled", "LeaseLost", "RunContext", "Stopping",
           "Suspend", "TakenRun", "UnstorableResult", "Worker", "WorkerStats", "default_owner"]

log = logging.getLogger("fencepost.worker")

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()


class Cancelled(Exception):
    """Cancellation was requested for the run; raised from ``RunContext.check()`` / ``checkpoint()``."""


class Stopping(Exception):
    """The worker is shutting down; raised from ``check()`` so the run is parked ``suspended``."""


#: Seconds a worker leaves a run it suspended (``Suspend``) before taking it again itself; other
#: runs are taken meanwhile. Without it a run that keeps suspending is claimed again at once, in a
#: loop that writes three journal entries each time.
SUSPEND_BACKOFF_S = 1.0


class Suspend(Exception):
    """Raise from a run function to park the run as ``suspended`` (claimable again later: this
    worker takes it again after ``SUSPEND_BACKOFF_S``)."""

    def __init__(self, state: Any = None) -> None:
        super().__init__("suspend")
        self.state = state


class UnstorableResult(Exception):
    """The run function returned (or suspended with) a value the store cannot hold; the run settles
    ``failed`` with this as its recorded reason."""


_NON_FINITE = ("it holds a float that is NaN or an infinity, which JSON has no form for (it would be "
               "stored as null)")
_NON_STR_KEY = ("it has a dict key that is not a string (a number or a bool), which JSON has no form for "
                "(it would come back as a string)")


def _shape_problem(value: Any, floats: bool) -> str | None:
    """What msgspec would change without a word when encoding ``value``: a dict key that is not a
    string (msgspec writes ``1`` as ``"1"``), or, with ``floats``, a float that is NaN or infinite
    (written as null). Looked for wherever msgspec encodes: through dicts, lists, tuples and sets,
    and through the dataclasses, Structs and other objects it encodes as JSON objects (read as
    ``msgspec.to_builtins`` reads them: floats and number keys kept as they are; keys it writes as
    strings of their own, an enum's or a UUID's, are strings there)."""
    try:
        value = msgspec.to_builtins(value)
    except Exception:  # pragma: no cover - the encoder accepted it, so this does too
        pass
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if floats and not math.isfinite(item):
                return _NON_FINITE
        elif isinstance(item, dict):
            if any(type(key) is not str for key in item):
                return _NON_STR_KEY
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
    return None


def _state_text(value: Any, what: str) -> str | None:
    """``value`` as the state_json text a settlement writes (None keeps the last checkpoint).

    A value JSON cannot encode, or whose text breaks the durable-value rules the store enforces, raises
    ``UnstorableResult`` naming the rule, so the caller settles the run ``failed`` instead of leaving it
    ``running`` to be taken over and run again.
    """
    if value is None:
        return None
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited: close it so Python does not warn about it later
        raise UnstorableResult(f"{what} cannot be stored: it is a coroutine or awaitable; the worker calls "
                               "the run function synchronously, so it must be a plain function, not async def")
    try:
        text = _json.encode(value).decode()
    except Exception as exc:  # msgspec's TypeError/EncodeError for a type JSON has no form for
        raise UnstorableResult(f"{what} cannot be stored as JSON: {exc}") from None
    # msgspec writes NaN and the infinities as null, and a number key as a string: the number, or
    # the key's type, would be lost without a word. Only a text holding null can hide such a float.
    # A text whose objects repeat a key (two keys written as one string, 1 and "1") loses a value on
    # every read: parse_json_text refuses it.
    problem = _shape_problem(value, floats="null" in text)
    if problem:
        raise UnstorableResult(f"{what} cannot be stored as JSON: {problem}")
    _, problem = parse_json_text(text)
    if problem == REPEATED_KEY:
        raise UnstorableResult(f"{what} cannot be stored as JSON: two of its keys would be stored as the same "
                               "string (one value would be lost)")
    if problem:
        raise UnstorableResult(f"{what} cannot be stored: its JSON text breaks a rule ({problem})")
    return text


_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0

#: Seconds between ``run()``'s looks for ``running`` runs whose lease went stale (a heartbeat
#: interval), while its sweeps for pending, suspended and stale-claimed runs come ten a second.
STALE_CHECK_S = INTERVAL_MS / 1000
_TRANSITIONED = Transitioned()

#: Seconds a worker that was asked to stop keeps retrying a write the database did not take (a
#: settlement, a checkpoint, releasing a claim), counted from when it noticed the stop; one last
#: attempt is made at the end of it, then the run is left to lapse (see ``Worker.run``).
STOP_GRACE_S = 2.0


#: ``db_code`` of a store that never comes back: closed, read-only, or (SQLite) kept to a file that
#: was deleted or replaced at its path (open the store again).
_GONE_FOR_GOOD = ("closed", "read_only", FILE_REPLACED)


def _worth_waiting(exc: BaseException, *, sweep: bool = False) -> bool:
    """Whether waiting may cure the failure ``exc``: the one rule for every retry in the worker.

    Only a ``persistence_failed`` error qualifies, never a refused argument; a lost fence is an
    outcome, not an error, and is never retried. A run's own writes, and the reads and claim writes
    made for one run during a sweep, retry what the database marked ``transient``: unavailable or
    busy (a lost connection, a server not accepting, a write lock held past the wait). With
    ``sweep`` the question is whether to sweep again later, so any other persistence failure (a full
    disk too) is waited out, except a store that never comes back (``_GONE_FOR_GOOD``: closed,
    read-only, or its file replaced), which ends the worker.
    """
    if not isinstance(exc, FencepostError) or exc.code != "persistence_failed":
        return False
    if sweep:
        return getattr(exc, "db_code", None) not in _GONE_FOR_GOOD
    return getattr(exc, "transient", False) is True


class TakenRun(RunRow, frozen=True):
    """A run ``Worker.take()`` activated for this worker: its ``RunRow``, and ``lease_since_ms``.

    ``lease_since_ms`` is a store-clock reading taken just before the activation (so no later than
    the heartbeat it stored). The store counts the run's lease from that heartbeat, so whoever holds
    the run afterwards counts its lease from this reading, however late the hold comes:
    ``worker.supervisor.hold(row.run_id, since_ms=row.lease_since_ms)``. A lease counted from the
    hold instead would outlast the stored one by the delay, and the run could still be running when
    a peer is allowed to take it over.
    """

    lease_since_ms: int | None = None


class WorkerStats(msgspec.Struct):
    """What one worker did: runs taken, how they ended, takeovers, leases lost."""

    claimed: int = 0
    takeovers: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    suspended: int = 0
    lost: int = 0
    recovered_claims: int = 0


def default_owner() -> OwnerId:
    """This process's owner identity: host name, pid and a fresh nonce for this incarnation."""
    return OwnerId(socket.gethostname() or "localhost", os.getpid(), uuid.uuid4().hex)


class RunContext:
    """What a run function gets: the run, its state, and the only ways to make progress durable."""

    def __init__(self, worker: Worker, row: RunRow, lease: Lease) -> None:
        self.worker = worker
        self.run_id = row.run_id
        self.row = row
        self.state: Any = _decode.decode(row.state_json)
        self.lease = lease
        self._pid = os.getpid()  # the process that took the run: the only one that writes for it
        self._given_back = threading.Event()  # the worker gave the run back while the function ran
        self._cancelled = threading.Event()
        if row.cancel_requested_at_ms is not None:
            self._cancelled.set()

    @property
    def owner(self) -> OwnerId:
        return self.worker.owner

    @property
    def cancel_requested(self) -> bool:
        """True once somebody asked to cancel this run."""
        return self._cancelled.is_set()

    def check(self) -> None:
        """Raise ``LeaseLost`` if the lease is gone, ``Cancelled`` if cancellation was requested,
        ``Stopping`` if the worker is shutting down (the run is then parked ``suspended``)."""
        self.lease.check()
        if self._cancelled.is_set():
            raise Cancelled(self.run_id)
        if self.worker._stopping.is_set():
            raise Stopping(self.run_id)

    def checkpoint(self, state: Any) -> None:
        """Record ``state`` durably with a guarded ``running`` transition (the run stays owned).

        The guard ``cancel_requested: absent`` means a checkpoint never lands on a run somebody asked
        to cancel: that answer (``GuardFailed``) raises ``Cancelled``; a lost fence raises ``LeaseLost``.
        A database that is unavailable or busy is retried with a backoff while the lease's write
        budget lasts (never once the lease is lost); only an outage longer than that, or a failure
        waiting cannot cure, raises ``RunStoreError``. While the worker is stopping the retries end
        after ``STOP_GRACE_S`` and raise ``Stopping``: the state given here is then not known to be
        recorded (it is not, unless the last attempt's COMMIT landed without its answer arriving).
        """
        # A value the store cannot hold is UnstorableResult naming the rule, as for a returned value.
        text = "null" if state is None else _state_text(state, "the checkpoint state")
        worker, runs = self.worker, self.worker.store.runs
        # A database that is briefly unavailable is waited out within the lease (``_owned_write``).
        try:
            outcome = worker._owned_write(self, "checkpoint", lambda: runs.transition_owned(
                self.run_id, self.owner, "running", state_json=text, guard={"cancel_requested": "absent"}))
        except RunStoreError as exc:
            if worker._stop_deadline() is not None and _worth_waiting(exc):
                raise Stopping(self.run_id) from exc
            raise
        if isinstance(outcome, GuardFailed):
            self._cancelled.set()
            raise Cancelled(self.run_id)
        if not isinstance(outcome, Transitioned):
            raise LeaseLost(self.run_id, type(outcome).__name__)
        self.state = state


RunFunction = Callable[[RunContext], Any]


def _call_in_this_process(fn: RunFunction, ctx: RunContext) -> Any:
    """``fn(ctx)``; in a process the function forked (``os.fork()`` in it), its end ends that process.

    The child of a fork runs on in the worker's code with the parent's owner identity: settling the
    run there would fence out the parent's own result, and the child would then wait in the thread
    pool for ever. So a forked child writes nothing: it exits with ``sys.exit``'s code (1 for any
    other exception, printed to stderr as Python prints one; 0 for a return), and the run is settled
    by the parent alone.
    """
    try:
        result = fn(ctx)
    except BaseException as exc:
        if os.getpid() != ctx._pid:
            _end_forked_child(exc)
        if ctx._given_back.is_set():
            raise _GivenBack(ctx.run_id) from exc
        raise
    if os.getpid() != ctx._pid:
        _end_forked_child(None)
    if ctx._given_back.is_set():
        raise _GivenBack(ctx.run_id)
    return result


class _GivenBack(LeaseLost):
    """The worker gave the run back while its function ran (``run()`` interrupted twice): the
    function's end is not recorded."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id, "given-back")

    def __reduce__(self):
        return (type(self), (self.run_id,))


def _end_forked_child(exc: BaseException | None) -> NoReturn:
    """End a forked child at once, as the interpreter would end it for ``exc`` (never unwinding back
    into the worker's code, whose ``finally`` blocks belong to the parent)."""
    code = 0
    if isinstance(exc, SystemExit):
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    elif exc is not None:
        traceback.print_exception(exc)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _wait_for_stop(stop: StopSignal, seconds: float) -> None:
    """Wait ``seconds`` or until ``stop`` is set: at once for an ``Event``, else within a tenth of a
    second (any ``StopSignal`` has ``is_set()``, not necessarily ``wait``)."""
    if isinstance(stop, threading.Event):
        stop.wait(seconds)
        return
    deadline = time.monotonic() + seconds
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.1))


class Worker:
    """Claim and run runs from ``store`` with ``fn`` on ``concurrency`` threads.

    ``fn(ctx)`` returns the final state (``None`` keeps the last checkpoint) to settle ``completed``;
    raising ``Cancelled`` (or returning after a request) settles ``cancelled``; ``Suspend(state)``
    parks the run; any other exception (``SystemExit`` too), or a result JSON cannot store
    (``UnstorableResult``), settles ``failed`` and records why (``RunRow.failure``:
    type, message and traceback, redacted); ``LeaseLost`` abandons the run to whoever
    holds it now. ``liveness`` decides whether the owner of an expired lease is gone
    (default ``lease_liveness()``; pass ``same_host_pid_probe`` to ask the operating system too).

    Every argument is checked here (``run`` and ``take`` check their own): a bad one raises
    ``ValueError`` naming it, before anything is claimed.
    """

    def __init__(self, store: Any, fn: RunFunction, *, owner: OwnerId | None = None, concurrency: int = 4,
                 liveness: LivenessCheck | None = None, run_prefix: str | None = None) -> None:
        _check_arguments(store, fn, owner, concurrency, liveness, run_prefix)
        self.store = store
        self.fn = fn
        self.owner = owner if owner is not None else default_owner()
        self.concurrency = concurrency
        self.liveness = liveness if liveness is not None else lease_liveness()
        self.run_prefix = run_prefix
        self.stats = WorkerStats()
        # Over a shard set, one supervisor per member (a member whose writes block delays only its
        # own runs' heartbeats), and each member's reads and takes on a thread of their own.
        self._member_calls = _MemberCalls() if len(_members(store)) > 1 else None
        self.supervisor: Supervisor | ShardSupervisor = (
            Supervisor(store, self.owner) if self._member_calls is None else ShardSupervisor(store, self.owner))
        # Runs a ``take()`` activated after it returned (a member that answered late): the next one returns them.
        self._late: list[TakenRun] = []
        self._contexts: dict[str, RunContext] = {}
        self._futures: dict[str, Future] = {}
        # Runs this worker suspended, by run id: the monotonic time before which it leaves them.
        self._resting: dict[str, float] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._stopping = threading.Event()
        self._stop_event: StopSignal | None = None  # run()'s ``stop``
        self._stop_at: float | None = None  # monotonic end of the stop grace, once a stop was noticed
        self._next_stale_check: float | None = None  # monotonic: run()'s next look for stale leases
        self._left_out = False  # a shard-set member was left out of the last read (it did not answer)
        self._gauge_attrs = {"host": self.owner.host_id, "pid": self.owner.pid, "worker": self.owner.nonce[:8]}

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    # ------------------------------------------------------------------ the loop
    def run(self, stop: StopSignal | None = None, *, until_idle: bool = False) -> WorkerStats:
        """Work until ``stop`` is set (or, with ``until_idle``, until nothing is claimable or running).

        Returns the counts. When ``stop`` is set no new run is taken; runs in hand finish, or are
        parked ``suspended`` (from their last checkpoint) when they next call ``check()``. A run taken
        whose function had not started yet (waiting for a free thread) is not run: it is given back
        at once, parked ``suspended`` and claimable by a peer (counted ``suspended``). A killed
        process instead leaves them ``running`` until their leases expire and a peer takes them over.

        A write that is waiting out an unavailable database when ``stop`` is set (a settlement, a
        checkpoint, releasing a claim) keeps retrying for ``STOP_GRACE_S`` more and is attempted at
        least once after the stop was noticed; then it is given up on (a checkpoint raises
        ``Stopping``), and its run stays ``running`` until its lease lapses and a peer takes it over,
        from its last checkpoint. So a stop during an outage returns within about ``STOP_GRACE_S`` plus
        two of the database's own waits for one call, rather than the lease's whole write budget.
        """
        problem = stop_problem(stop)
        if problem:
            raise ValueError(f"stop {problem}")
        if type(until_idle) is not bool:
            raise ValueError("until_idle must be True or False")
        stop = stop if stop is not None else threading.Event()
        self._stopping.clear()
        self._stop_event, self._stop_at = stop, None
        # Cancel polls are paced on time that never runs backwards: a store clock stepped back (an
        # NTP correction) would leave requests unread for as long as the step.
        steady = Steady(self.store.clock)
        self.supervisor.start()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="fencepost-run")
        try:
            next_cancel_check = steady.now_ms()
            backoff = 0.0  # > 0 while the database is unavailable
            while not stop.is_set():
                self._reap()
                free = self.concurrency - len(self._futures)
                took = 0
                try:
                    if free > 0:
                        took = len(self._sweep(free, lambda row, lease: self._start(pool, row, lease), paced=True))
                    now = steady.now_ms()
                    if now >= next_cancel_check:
                        self._observe_cancellations()
                        next_cancel_check = now + INTERVAL_MS
                    idle = (until_idle and took == 0 and not self._futures and not self._resting_now()
                            and not self._waiting_for_leases())
                except FencepostError as exc:
                    # An unavailable database (a server restarting, a write lock held past the busy
                    # timeout) is waited out: the leases in hand ride on supervision's write
                    # tolerance meanwhile. Anything else, a closed store included, ends the worker.
                    if not _worth_waiting(exc, sweep=True):
                        raise
                    if not backoff:
                        name = getattr(exc, "store", None)
                        log.warning("worker: database unavailable (%s%s); sweeping again once it answers",
                                    getattr(exc, "db_code", None) or exc.code,
                                    "" if name is None else f", shard {one_line(str(name))}")
                    backoff = min(backoff * 2, _MAX_BACKOFF_S) if backoff else _FIRST_BACKOFF_S
                    _wait_for_stop(stop, backoff)
                    continue
                if backoff:
                    log.warning("worker: database available again")
                    backoff = 0.0
                if idle:
                    break
                if took == 0 or not free:
                    self._done.wait(0.1)
                    self._done.clear()
        finally:
            # Nothing new is taken; runs in hand finish, or park ``suspended`` at their next
            # ``check()`` (their leases are still renewed meanwhile). A process that must stop at
            # once is killed instead, and its leases simply expire.
            try:
                self._stopping.set()
                self._stop_deadline()  # the stop grace of writes still retrying counts from here at the latest
                # A run taken but whose function no thread of the pool has started yet is not in hand:
                # given back now, claimable by a peer at once, rather than dropped by the shutdown below
                # and left ``running`` under a lease nobody renews any more.
                self._give_back_unstarted()
                pool.shutdown(wait=True, cancel_futures=True)
            except BaseException:
                # Interrupted while waiting for the runs in hand (Ctrl-C again): stop waiting. Their
                # functions cannot be stopped, so their runs are given back now rather than left
                # ``running`` after the host closes the store; then the interrupt goes on.
                pool.shutdown(wait=False, cancel_futures=True)
                self._give_back_in_hand()
                raise
            finally:
                self._reap()
                self.supervisor.stop()
                _gauges.worker_in_flight.discard(**self._gauge_attrs)
        return self.stats

    def _stop_deadline(self) -> float | None:
        """The monotonic time at which retries give up because the worker is stopping (``STOP_GRACE_S``
        after the stop was first noticed), or None while it is not stopping."""
        if self._stop_at is None:
            stop = self._stop_event
            if not (self._stopping.is_set() or (stop is not None and stop.is_set())):
                return None
            with self._lock:
                if self._stop_at is None:
                    self._stop_at = time.monotonic() + STOP_GRACE_S
        return self._stop_at

    def _stop_passed(self, began: float) -> bool:
        """Whether a retry loop must give up for the stop: the grace is over and the attempt that just
        failed (begun at ``began``, monotonic) started after the stop was noticed (its last attempt)."""
        until = self._stop_deadline()
        return until is not None and time.monotonic() >= until and began >= until - STOP_GRACE_S

    def _resting_now(self) -> set[str]:
        """The runs this worker suspended that are still resting (forgetting those whose time is up)."""
        now = time.monotonic()
        with self._lock:
            for run_id in [r for r, until in self._resting.items() if until <= now]:
                del self._resting[run_id]
            return set(self._resting)

    def _in_hand(self) -> set[str]:
        """The runs whose function this worker is still executing (lease held or not)."""
        with self._lock:
            return set(self._futures)

    def _waiting_for_leases(self) -> bool:
        # With until_idle, a run held by a live peer keeps us waiting; one held by an expired lease
        # will become claimable, so wait for it too rather than stopping with work left behind. A
        # shard-set member that did not answer may hold such runs too: it keeps us waiting as well.
        self._left_out = False
        return bool(self._candidates(1, include_live=True)) or self._left_out

    def _start(self, pool: ThreadPoolExecutor, row: RunRow, lease: Lease) -> None:
        ctx = RunContext(self, row, lease)
        with self._lock:
            # Checked under the lock ``_give_back_unstarted`` takes after the stop is set: a run is
            # either submitted before that look (and given back by it) or refused here (``Stopping``,
            # given back by ``_started``), never submitted to a pool that is shutting down.
            if self._stopping.is_set():
                raise Stopping(row.run_id)
            self._contexts[row.run_id] = ctx
            # Counted before the function can start, so a reading never lags a run already running.
            _gauges.worker_in_flight.set(len(self._futures) + 1, **self._gauge_attrs)
            try:
                self._futures[row.run_id] = pool.submit(self._execute, ctx)
            except BaseException:  # not started: nothing of it stays in hand (the sweep gives it back)
                del self._contexts[row.run_id]
                _gauges.worker_in_flight.set(len(self._futures), **self._gauge_attrs)
                raise

    def _give_back_unstarted(self) -> None:
        """Once the worker is stopping: every run whose function the pool has not started yet (its
        future still queued for a thread) is taken out of the pool and given back (``_give_back``),
        parked ``suspended`` from its last checkpoint and claimable by a peer at once. Counted
        ``suspended``, as a run parked at its ``check()``. A run whose function has started is left
        to finish, or to park at its next ``check()``."""
        with self._lock:
            # ``Future.cancel()`` succeeds only on a future no thread has taken: never run after this.
            unstarted = [r for r, f in self._futures.items() if f.cancel()]
            contexts = [self._contexts.pop(r) for r in unstarted]
            for r in unstarted:
                del self._futures[r]
            if unstarted:
                _gauges.worker_in_flight.set(len(self._futures), **self._gauge_attrs)
        for ctx in contexts:
            if self._give_back(ctx.run_id, ctx.lease, "the worker stopped before its function started"):
                self._count("suspended")

    def _give_back_in_hand(self) -> None:
        """``run()`` was interrupted while it waited for the runs in hand: give each back (parked
        ``suspended`` from its last checkpoint, counted ``suspended``) while its function still
        runs. That function's end then writes nothing for the run (``_GivenBack``)."""
        with self._lock:
            contexts = [ctx for r, ctx in self._contexts.items() if r in self._futures and not self._futures[r].done()]
        for ctx in contexts:
            ctx._given_back.set()
            if self._give_back(ctx.run_id, None, "the worker was interrupted while its function ran"):
                self._count("suspended")

    def _reap(self) -> None:
        with self._lock:
            finished = [r for r, f in self._futures.items() if f.done()]
            for r in finished:
                del self._futures[r]
                self._contexts.pop(r, None)
            if finished:
                _gauges.worker_in_flight.set(len(self._futures), **self._gauge_attrs)

    # ------------------------------------------------------------------ finding and taking work
    def _candidates(self, limit: int, *, include_live: bool = False,
                    stale_running: bool = True) -> list[dict[str, Any]]:
        now = self.store.clock.now_ms()
        cutoff = now - STALE_MS

        def read(conn):
            # One statement per kind of candidate, each answered from an index in the sweep's order
            # (the status index; for claims, the partial index of the rows that have one), merged
            # here: a single OR of them left the claims' branch without an index, and every sweep
            # read the whole table, settled runs included. All in one read transaction: one snapshot.
            unclaimed = runs_t.c.claim_host_id.is_(None)
            claimed = runs_t.c.claim_host_id.is_not(None)
            kinds = [and_(runs_t.c.status == "pending", unclaimed), and_(runs_t.c.status == "suspended", unclaimed)]
            if include_live:
                kinds += [runs_t.c.status == "running", claimed]
            else:
                if stale_running:
                    kinds.append(and_(runs_t.c.status == "running", runs_t.c.heartbeat_at_ms < cutoff, unclaimed))
                kinds.append(and_(claimed, runs_t.c.claimed_at_ms < cutoff))
            # ``limit`` may be any int >= 1 (``take``'s, or ``concurrency`` times four); the SQL LIMIT is
            # a 64-bit integer, and no table holds more than 2**53 rows anyway.
            n = min(limit, SAFE_MAX)
            found: dict[str, dict[str, Any]] = {}
            for kind in kinds:
                if self.run_prefix is not None:
                    # Case for case on both backends (SQLite's LIKE ignores ASCII case).
                    kind = and_(kind, func.substr(runs_t.c.run_id, 1, len(self.run_prefix)) == self.run_prefix)
                stmt = (select(*_CANDIDATE_COLUMNS).where(kind)
                        .order_by(runs_t.c.created_at_ms, runs_t.c.run_id).limit(n))
                for r in conn.execute(stmt):
                    found.setdefault(r.run_id, dict(r._mapping))  # a live run may also hold a claim
            return sorted(found.values(), key=lambda c: (c["created_at_ms"], c["run_id"]))[:n]

        if self._member_calls is None:
            return _read(self.store, read, "worker_candidates")
        answers, left_out = self._read_members(read, "worker_candidates")
        self._left_out = bool(left_out)
        found = [{**c, "shard": name} for name, rows in answers.items() for c in rows]
        if len(found) > limit:  # several shards: the oldest ``limit`` of them all
            found = sorted(found, key=lambda c: (c["created_at_ms"], c["run_id"]))[:limit]
        return found

    def _read_members(self, read: Callable[[Any], Any], method: str) -> tuple[dict[str, Any], list[str]]:
        """``read`` on every member of the shard set at once (``_MemberCalls``): the answers by member,
        and the members left out (still busy with an earlier call, or not answering within
        ``MEMBER_WAIT_S``). A member that failed in time raises its error (naming it), as a store's
        own read would, after every member was waited for."""
        calls = {str(name): partial(_read, member, read, method, name) for name, member in _members(self.store)}
        assert self._member_calls is not None
        answers, failures, left_out = self._member_calls.call(calls, "read")
        for failure in failures.values():
            raise failure
        return answers, left_out

    def take(self, limit: int) -> list[TakenRun]:
        """Sweep once and take up to ``limit`` runs; return the rows now owned (activated) by this worker.

        Nothing holds them yet: each ``TakenRun`` is a ``RunRow`` that also carries ``lease_since_ms``,
        the store-clock reading taken just before its activation. Hold a run counting its lease from
        there, ``self.supervisor.hold(row.run_id, since_ms=row.lease_since_ms)``, never from the hold
        itself: the store counts the lease from the activation, and a caller that holds late would
        otherwise keep running the run after a peer may take it over.

        Candidates are shuffled so that workers sweeping at once mostly pick different runs; a lost
        race is an outcome (``AlreadyClaimed``, ``SnapshotChanged`` ...) and the run is skipped.
        When a step fails after some runs were taken (the database went away mid-sweep), the sweep
        stops there and returns those runs, which are this worker's to run; the failure is raised
        only when nothing was taken. Reading a run's row right after activating it waits out a
        database that is unavailable or busy, within the activation's write budget.
        """
        if type(limit) is not int or limit < 1:
            raise ValueError("limit must be an integer >= 1")
        return self._sweep(limit)

    def _sweep(self, limit: int, start: Callable[[RunRow, Lease], None] | None = None, *,
               paced: bool = False) -> list[TakenRun]:
        """``take(limit)``; with ``start``, each run is held as it is activated (``_take_one``) and
        ``start(row, lease)`` is called on it as soon as it is taken (``run()`` starts it there). A later
        candidate's steps may wait out an outage on this thread (releasing its claim, for up to the
        claim's budget): a run already taken must not wait with them, neither run nor held. A run
        whose hold or ``start`` raises is given back (``_give_back``), left out of the result, and the
        sweep goes on with the next candidate.

        ``paced`` (``run()``'s sweeps, ten a second while idle): ``running`` runs whose lease went
        stale are looked for once per ``STALE_CHECK_S``, not at every sweep.
        That query cannot stop early while no lease is stale (no index holds the heartbeat, which
        every heartbeat would rewrite), so it reads every running run; a lease goes stale only
        after ``STALE_AFTER`` (30 s), so stale runs join the candidates a second later at most
        (among many candidates, the shuffled pick may then take a few looks to reach them)."""
        late: list[TakenRun] = []
        if start is None and self._late:  # ``take()``: runs activated after an earlier one returned
            with self._lock:
                late, self._late = self._late[:limit], self._late[limit:]
            if len(late) >= limit:
                return late
            limit -= len(late)
        stale = True
        if paced:
            now = time.monotonic()
            stale = self._next_stale_check is None or now >= self._next_stale_check
            if stale:
                self._next_stale_check = now + STALE_CHECK_S
        # Runs this worker suspended are left alone for a while; read enough for the others. Which
        # runs rest is asked again after the read: a run may have been suspended during it (its
        # rest begins before it is claimable, so a read that sees it claimable sees it resting).
        # Runs still in hand are skipped too: one whose lease was lost while its function had not yet
        # reached ``check()`` is left to peers until that execution returns, never run twice here.
        found = self._candidates(limit * 4 + len(self._resting_now()) + len(self._in_hand()), stale_running=stale)
        skip = self._resting_now() | self._in_hand()
        found = [c for c in found if c["run_id"] not in skip]
        random.shuffle(found)
        if self._member_calls is not None:
            return late + self._take_from_members(found, limit, start)
        taken: list[TakenRun] = []
        for cand in found:
            if len(taken) >= limit:
                break
            try:
                took = self._take_one(cand, hold=start is not None)
            except Exception as exc:
                if not taken:
                    raise
                # The runs already taken are this worker's now: raising would drop them, to sit
                # ``running`` unheld until their leases expire. Return them to be run (or held by the
                # caller), and leave the rest to the next sweep, which meets the failure again.
                log.warning("worker: sweep stopped after taking %d run(s): %s (%s)", len(taken), type(exc).__name__,
                            getattr(exc, "db_code", None) or getattr(exc, "code", None))
                break
            if took is None:
                continue
            row, lease = took
            if not self._started(row, lease, start):
                continue
            taken.append(row)
        return taken

    def _started(self, row: TakenRun, lease: Lease | None, start: Callable[[RunRow, Lease], None] | None) -> bool:
        """``start(row, lease)`` when the sweep starts what it takes; False when starting failed:
        activated and held, but not running, the run is given back at once rather than left
        ``running`` under this worker until its lease lapses (the sweep goes on)."""
        if start is None or lease is None:
            return True
        try:
            start(row, lease)
        except Stopping:  # taken as the worker began to stop (a shard's late answer): not started
            if self._give_back(row.run_id, lease, "the worker stopped before its function started"):
                self._count("suspended")
            return False
        except Exception as exc:
            self._give_back(row.run_id, lease, "starting it", exc)
            return False
        return True

    def _take_from_members(self, found: list[dict[str, Any]], limit: int,
                           start: Callable[[RunRow, Lease], None] | None) -> list[TakenRun]:
        """The taking half of a sweep over a shard set: each member's candidates are taken on that
        member's own thread, every member at once (``_MemberCalls``), as ``_sweep`` takes them on one
        store, within ``limit`` in all. A member whose write lock is held delays only its own runs:
        after ``MEMBER_WAIT_S`` the sweep returns what the others took, and the late member takes
        no run after the one it is on. That run, once taken, is started as any (``run()``), or
        returned by the next ``take()``; a member still busy is left out of the sweeps until it
        answers, and its run in flight counts against their ``limit``."""
        calls = self._member_calls
        assert calls is not None
        limit -= calls.busy("take")
        if limit <= 0:
            return []
        by_member: dict[str, list[dict[str, Any]]] = {}
        for cand in found:
            by_member.setdefault(cand["shard"], []).append(cand)
        budget = [limit]
        handover = threading.Lock()  # the sweep's end against a member finishing at that moment
        over = threading.Event()
        taken: list[TakenRun] = []
        failures: list[Exception] = []

        def slot(n: int) -> bool:
            with handover:
                if n < 0 or (budget[0] > 0 and not over.is_set()):
                    budget[0] -= n
                    return True
                return False

        def take(name: str, cands: list[dict[str, Any]]) -> None:
            mine: list[TakenRun] = []
            failure: Exception | None = None
            for cand in cands:
                if not slot(1):
                    break
                try:
                    took = self._take_one(cand, hold=start is not None)
                except Exception as exc:
                    slot(-1)
                    if not mine:
                        failure = exc
                    else:
                        log.warning("worker: sweep of shard %s stopped after taking %d run(s): %s (%s)",
                                    one_line(name), len(mine), type(exc).__name__,
                                    getattr(exc, "db_code", None) or getattr(exc, "code", None))
                    break
                if took is None:
                    slot(-1)
                    continue
                row, lease = took
                if not self._started(row, lease, start):
                    slot(-1)
                    continue
                mine.append(row)
            with handover:
                if not over.is_set():
                    taken.extend(mine)
                    if failure is not None:
                        failures.append(failure)
                    return
            if start is None and mine:  # ``take()`` has returned: the next one hands these over
                with self._lock:
                    self._late.extend(mine)
            if failure is not None:
                log.warning("worker: shard %s answered late: %s (%s)", one_line(name), type(failure).__name__,
                            getattr(failure, "db_code", None) or getattr(failure, "code", None))

        _, crashed, _ = calls.call({name: partial(take, name, cands) for name, cands in by_member.items()}, "take")
        with handover:
            over.set()
            result, failed = list(taken), list(failures) + list(crashed.values())
        if failed and not result:
            raise failed[0]
        for exc in failed:
            shard = getattr(exc, "store", None)
            log.warning("worker: sweep took runs of other shards; one failed: %s (%s%s)", type(exc).__name__,
                        getattr(exc, "db_code", None) or getattr(exc, "code", None),
                        "" if shard is None else f", shard {one_line(str(shard))}")
        return result

    def _take_one(self, cand: dict[str, Any], *, hold: bool) -> tuple[TakenRun, Lease | None] | None:
        """Claim and activate ``cand``'s run, then read its row: the row (with the reading its lease
        counts from) and, with ``hold``, its lease (held from the activation on), or None when a race
        was lost or the lease was lost meanwhile."""
        runs = self.store.runs
        now = self.store.clock.now_ms()
        # The wall-clock start of the claim's write budget (``TOLERANCE_MS``): the retries below
        # measure it on the monotonic clock, so a store clock that stands still (``ManualClock``)
        # cannot keep them going; fencing is the store's, on its own clock, as ever.
        started = time.monotonic()
        run_id = cand["run_id"]
        if cand["claim_host_id"] is not None:
            self._recover_claim(cand, now)
            return None
        owner = _owner(cand, "owner")
        expected = RunSnapshot(cand["status"], owner, cand["heartbeat_at_ms"])
        if cand["status"] == "running":
            # A stale run under this worker's own owner that it is not executing (its lease was lost,
            # its settlement failed) is gone as far as this worker knows: a liveness check by process
            # id would call it alive for ever, this process being alive.
            own = owner == self.owner and run_id not in self._in_hand() and run_id not in self.supervisor.held()
            if owner is None or (not own and self.liveness(
                    owner, LivenessContext(self.owner, cand["heartbeat_at_ms"], now))):
                return None
            evidence = LivenessEvidence(owner, now, "lease-expired" if own else self._evidence_kind(owner))
            claimed = runs.steal(run_id, expected, self.owner, now, evidence)
        else:
            claimed = runs.claim(run_id, expected, self.owner, now)
        if not isinstance(claimed, Claimed):
            return None
        budget_ends = started + TOLERANCE_MS / 1000
        # Read before activating: the heartbeat the activation stores is stamped no earlier than this.
        stamped_after = self.store.clock.now_ms()
        try:
            activated = runs.activate(run_id, self.owner, claimed.claimed_at_ms, expected)
        except BaseException as exc:
            # Released at once, or the run would wait for the claim to go stale (``STALE_AFTER``).
            # The activation failed most likely because the database is unavailable, so the release
            # rides the outage out within the claim's budget (not after an interrupt: one attempt).
            # An interrupt (Ctrl-C) goes on whatever the release met: the sweep would take a release
            # that failed for an outage as the outage and sweep on. Its claim then goes stale.
            interrupted = not isinstance(exc, Exception)
            try:
                self._retry_for_run(run_id, "releasing the claim",
                                    lambda: runs.abandon_claim(run_id, self.owner, claimed.claimed_at_ms),
                                    started if interrupted else budget_ends)
            except Exception:
                if not interrupted:
                    raise
            raise
        if not isinstance(activated, Activated):
            return None
        # Activated with a first heartbeat at about now: the run is this worker's from here on.
        # A run dropped here would sit ``running``, held by nobody, until its lease expired.
        # Held from here, its lease counted from a reading taken before the activation: the store
        # counts the run's lease from the activation's heartbeat, and a lease counted from a later
        # hold could outlast it (a peer may take the run once that heartbeat is STALE_AFTER old).
        # Just activated, so no verifying read.
        try:
            lease = self.supervisor.hold(run_id, verify=False, since_ms=stamped_after) if hold else None
        except Exception as exc:
            self._give_back(run_id, None, "holding it", exc)
            return None
        try:
            row = self._retry_for_run(run_id, "reading the run just activated", lambda: runs.get(run_id),
                                      budget_ends, lease)
        except LeaseLost:
            if lease is not None:
                lease.release()
            self._count("lost")
            log.warning("run %s: lease lost before its row could be read; left to its current owner", run_id,
                        extra={"run_id": run_id})
            return None
        except BaseException:
            if lease is not None:
                lease.release()  # the run lapses from its stored heartbeat, as when nobody held it
            raise
        self._count("claimed")
        if cand["status"] == "running":
            self._count("takeovers")
            log.info("run %s: took it over, its lease expired", run_id, extra={"run_id": run_id})
        return TakenRun(**msgspec.structs.asdict(row), lease_since_ms=stamped_after), lease

    def _give_back(self, run_id: str, lease: Lease | None, what: str, exc: Exception | None = None) -> bool:
        """Give back a run this sweep activated but could not run (``what``, holding or starting it,
        raised ``exc``; without ``exc``, ``what`` says why it is not run, a stop, logged at ``INFO``
        as no error): logged naming the run, then parked ``suspended`` from its last checkpoint,
        claimable again (this worker leaves it for ``SUSPEND_BACKOFF_S``, as after ``Suspend``, so a
        failure that repeats does not spin). The transition is fenced by the owner and retried
        (``_retry_for_run``) within the write budget and while ``lease``, if held, lasts; when it
        cannot be made the run lapses from the heartbeat its activation stored, as if nobody held it.
        Never raises: the sweep goes on with its other runs. True once the run is parked."""
        if exc is None:
            log.info("run %s: %s; giving the run back", run_id, what, extra={"run_id": run_id})
        else:
            log.error("run %s: %s failed; giving the run back\n%s", run_id, what, self._log_traceback(run_id, exc),
                      extra={"run_id": run_id})
        with self._lock:
            # Before the run is claimable again: this worker's next sweep must not take it back at once.
            self._resting[run_id] = time.monotonic() + SUSPEND_BACKOFF_S
        runs = self.store.runs
        try:
            outcome = self._retry_for_run(run_id, "giving the run back",
                                          lambda: runs.transition_owned(run_id, self.owner, "suspended"),
                                          time.monotonic() + TOLERANCE_MS / 1000, lease)
        except Exception as failure:  # LeaseLost too: the run is another owner's, or lapses
            log.warning("run %s: could not be given back (%s); its lease lapses and a worker takes it over",
                        run_id, getattr(failure, "db_code", None) or getattr(failure, "code", None)
                        or type(failure).__name__, extra={"run_id": run_id})
            return False
        finally:
            if lease is not None:
                lease.release()
        if isinstance(outcome, Transitioned):
            log.info("run %s settled suspended (given back)", run_id, extra={"run_id": run_id})
            return True
        return False

    def _retry_for_run(self, run_id: str, what: str, call: Callable[[], Any], until: float,
                       lease: Lease | None = None) -> Any:
        """``call()``, a step of taking ``run_id`` during a sweep, retried (``_retry``) until the monotonic
        time ``until``: the wall clock keeps a store clock that stands still (``ManualClock``) from
        retrying forever. A run already held (``lease``, counted from its activation) is bounded by
        its lease as well: once that is lost (``LeaseLost``), a peer may take the run over. The steps
        retried here (reading the row, releasing the claim) are safe to repeat, since the claim's
        token or the owner fences them in the store."""
        bound = "the claim's budget" if lease is None else "its lease and the claim's budget"
        return self._retry(run_id, what, call, bound, now=time.monotonic, deadline=lambda: until, lease=lease)

    def _evidence_kind(self, owner: OwnerId) -> str:
        if self.liveness is same_host_pid_probe and owner.host_id == self.owner.host_id:
            return "same-host-pid-dead"
        return "lease-expired"

    def _recover_claim(self, cand: dict[str, Any], now: int) -> None:
        claimant = _owner(cand, "claim")
        if claimant is None or cand["claimed_at_ms"] >= now - STALE_MS:
            return
        evidence = LivenessEvidence(claimant, now, "lease-expired")
        outcome = self.store.runs.recover_claim(cand["run_id"], claimant, cand["claimed_at_ms"], self.owner,
                                                now, evidence)
        if isinstance(outcome, Recovered):
            self._count("recovered_claims")

    # ------------------------------------------------------------------ running and settling
    def _execute(self, ctx: RunContext) -> None:
        try:
            self._execute_inner(ctx)
        except _GivenBack:
            log.info("run %s: its function ended after the run was given back; its end is not recorded",
                     ctx.run_id, extra={"run_id": ctx.run_id})
        except LeaseLost:
            self._count("lost")
            log.warning("run %s: lease lost, left to its current owner", ctx.run_id, extra={"run_id": ctx.run_id})
        except Exception as exc:
            if self._stop_deadline() is not None and _worth_waiting(exc):
                # Given up on for the stop (``_owned_write`` said so): the run lapses, nothing is lost.
                log.warning("run %s: not settled before the worker stopped (%s); left for its lease to lapse",
                            ctx.run_id, getattr(exc, "db_code", None) or getattr(exc, "code", None),
                            extra={"run_id": ctx.run_id})
            elif isinstance(exc, FencepostError) and exc.code == "persistence_failed":
                # The database's own failure (a full disk, an outage past the lease): one line that
                # says which run and why; fencepost's frames tell an operator nothing more.
                log.error("run %s: settling it failed (%s: %s); its lease lapses and a worker takes it over",
                          ctx.run_id, getattr(exc, "db_code", None) or exc.code, exc.detail,
                          extra={"run_id": ctx.run_id})
            else:
                log.error("run %s: settling it failed\n%s", ctx.run_id, self._log_traceback(ctx.run_id, exc),
                          extra={"run_id": ctx.run_id})
        finally:
            ctx.lease.release()
            self._done.set()

    def _execute_inner(self, ctx: RunContext) -> None:
        ctx.lease.check()  # a lease lost before the function starts: never start it
        if ctx.cancel_requested:
            self._settle_cancelled(ctx)
            return
        try:
            if self._stopping.is_set():  # taken by a thread of the pool as the stop came: never started
                raise Stopping(ctx.run_id)
            result = _call_in_this_process(self.fn, ctx)
        except Cancelled as exc:
            self._settle_cancelled(ctx, exc)
            return
        except (Suspend, Stopping) as s:
            ctx.lease.check()
            try:
                text = _state_text(s.state if isinstance(s, Suspend) else None, "the state given to Suspend")
            except UnstorableResult as exc:
                self._settle_failed(ctx, exc)
                return
            if isinstance(s, Suspend):
                # Before the run is claimable again: this worker's sweep must not take it back at once.
                with self._lock:
                    self._resting[ctx.run_id] = time.monotonic() + SUSPEND_BACKOFF_S
            outcome = self._settle_write(ctx, "suspended", state_json=text, guard={"cancel_requested": "absent"})
            if isinstance(outcome, GuardFailed):
                self._settle_cancelled(ctx)
            elif isinstance(outcome, Transitioned):
                self._count("suspended")
                log.info("run %s settled suspended", ctx.run_id, extra={"run_id": ctx.run_id})
            return
        except LeaseLost:
            raise
        except BaseException as exc:  # sys.exit() in a run function fails the run, like any exception
            self._settle_failed(ctx, exc)
            return
        ctx.lease.check()
        try:
            text = _state_text(result, "the run function's return value")
        except UnstorableResult as exc:
            self._settle_failed(ctx, exc)
            return
        outcome = self._settle_write(ctx, "completed", state_json=text, guard={"cancel_requested": "absent"})
        if isinstance(outcome, GuardFailed):
            self._settle_cancelled(ctx)
        elif isinstance(outcome, Transitioned):
            self._count("completed")
            log.info("run %s settled completed", ctx.run_id, extra={"run_id": ctx.run_id})
        else:
            raise LeaseLost(ctx.run_id, type(outcome).__name__)

    def _settle_failed(self, ctx: RunContext, exc: BaseException) -> None:
        ctx.lease.check()
        # The reason rides the same UPDATE as the settlement (redacted by the store).
        failure = RunFailure.from_exception(exc)
        outcome = self._settle_write(ctx, "failed", failure=failure)
        if isinstance(outcome, Transitioned):
            self._count("failed")
            log.warning("run %s settled failed: %s\n%s", ctx.run_id, type(exc).__name__,
                        self._log_traceback(ctx.run_id, exc, failure), extra={"run_id": ctx.run_id})
        else:
            log.warning("run %s raised but could not be settled failed (%s)\n%s", ctx.run_id,
                        type(outcome).__name__, self._log_traceback(ctx.run_id, exc, failure),
                        extra={"run_id": ctx.run_id})

    def _settle_write(self, ctx: RunContext, to: str, **kwargs: Any) -> Any:
        """``transition_owned`` of ``ctx``'s run to ``to``, riding out a short outage (``_owned_write``).

        A settlement retried after a COMMIT whose answer was lost may have landed the first time: the
        retry (or the next pulse) then finds the run no longer this owner's. When the row shows the
        settlement this worker wrote (the status, no owner, the state it sent), it counts as done.
        """
        runs = self.store.runs

        def landed() -> bool:
            try:
                row = runs.get(ctx.run_id)
            except FencepostError:
                return False
            state = kwargs.get("state_json")
            return row.status == to and row.owner is None and (state is None or row.state_json == state)

        return self._owned_write(ctx, f"settling {to}",
                                 lambda: runs.transition_owned(ctx.run_id, self.owner, to, **kwargs), landed)

    def _owned_write(self, ctx: RunContext, what: str, call: Callable[[], Any],
                     landed: Callable[[], bool] | None = None) -> Any:
        """``call()``, a fenced write to ``ctx``'s run, retried while the database is unavailable or busy.

        A worker host expects an outage shorter than the lease to be ridden out, so the write is
        retried (``_retry``) until the lease's deadline as it stood at the first failure, at most
        ``WRITE_TOLERANCE``: the persisted heartbeat protects the run from a takeover until then. That
        deadline is on the lease's pace (its supervisor's ``steady``), as the lease is. The lease is
        checked before every attempt, so nothing is tried once it is lost (and every attempt is fenced
        in the store as ever).

        ``landed()`` tells whether an earlier attempt whose COMMIT got no answer did land: a retry
        that then finds the fence gone (``FenceLost``, or the lease lost to the next pulse) returns
        ``Transitioned`` when it did.
        """
        steady = ctx.lease.supervisor.steady
        return self._retry(ctx.run_id, what, call, "the lease", now=lambda: steady.now_ms() / 1000,
                           deadline=lambda: ctx.lease.deadline_ms / 1000, lease=ctx.lease, landed=landed)

    def _retry(self, run_id: str, what: str, call: Callable[[], Any], bound: str, *, now: Callable[[], float],
               deadline: Callable[[], float], lease: Lease | None = None,
               landed: Callable[[], bool] | None = None) -> Any:
        """``call()``, one step for ``run_id``, retried while the database is unavailable or busy: the one
        retry loop of the worker (a run's own writes, ``_owned_write``; a step of taking a run during a
        sweep, ``_retry_for_run``).

        A failure waiting may cure (``_worth_waiting``: never a refused argument, a lost fence or a store
        that cannot come back) is retried with a backoff (0.1 s doubling to 2 s) until ``deadline()``,
        read once at the first failure, in seconds on the clock ``now()``; ``bound`` names that budget
        in the log. Then the last failure is raised. With a ``lease``, it is checked before every
        attempt and a pause ends once it is lost. Once the worker is stopping the retries end sooner:
        after ``STOP_GRACE_S``, with at least one attempt begun after the stop was noticed
        (``_stop_passed``). ``landed`` is ``_owned_write``'s.
        """
        backoff = _FIRST_BACKOFF_S
        give_up_at: float | None = None
        unknown = False  # an attempt's COMMIT got no answer: it may have landed
        while True:
            began = time.monotonic()
            try:
                if lease is not None:
                    lease.check()
                result = call()
            except LeaseLost:
                if unknown and landed is not None and landed():
                    return _TRANSITIONED
                raise
            except RunStoreError as exc:
                if not _worth_waiting(exc):
                    raise
                unknown = unknown or COMMIT_UNKNOWN in exc.detail
                if give_up_at is None:
                    give_up_at = deadline()
                    log.warning("run %s: %s: database unavailable (%s); retrying within %s", run_id, what,
                                getattr(exc, "db_code", None) or exc.code, bound, extra={"run_id": run_id})
                if now() + backoff >= give_up_at:
                    log.warning("run %s: %s: the database did not answer within %s; giving up", run_id, what,
                                bound, extra={"run_id": run_id})
                    raise
                if self._stop_passed(began):
                    log.warning("run %s: %s: the worker is stopping and the database did not answer; giving up",
                                run_id, what, extra={"run_id": run_id})
                    raise
                _pause(backoff, lease, self._stop_deadline)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            if give_up_at is not None:
                if unknown and isinstance(result, FenceLost) and landed is not None and landed():
                    result = _TRANSITIONED
                log.warning("run %s: %s went through once the database answered", run_id, what,
                            extra={"run_id": run_id})
            return result

    def _log_traceback(self, run_id: str, exc: BaseException, failure: RunFailure | None = None) -> str:
        """``exc``'s traceback for a log line, redacted as ``run_id``'s stored failure is (see
        ``runstore._tracebacks.logged_traceback``): handlers get this text, never the exception."""
        return logged_traceback(exc, store_redaction(self.store, run_id), failure)

    def _settle_cancelled(self, ctx: RunContext, raised: Cancelled | None = None) -> None:
        """Settle ``cancelled`` under the guard that a cancel request is on the run. A function that
        raised ``Cancelled`` (``raised``) with none there settles ``failed`` instead: a run is never
        recorded cancelled without a request, and one left ``running`` would be run again."""
        runs, now = self.store.runs, self.store.clock.now_ms()
        self._owned_write(ctx, "acknowledging the cancel request",
                          lambda: runs.acknowledge_cancel(ctx.run_id, self.owner, now))
        outcome = self._settle_write(ctx, "cancelled", guard={"cancel_requested": "present"})
        if isinstance(outcome, Transitioned):
            self._count("cancelled")
            log.info("run %s settled cancelled", ctx.run_id, extra={"run_id": ctx.run_id})
        elif not isinstance(outcome, GuardFailed):
            raise LeaseLost(ctx.run_id, type(outcome).__name__)
        else:
            log.warning("run %s: the function raised Cancelled but no cancel request is on the run; "
                        "settling it failed", ctx.run_id, extra={"run_id": ctx.run_id})
            self._settle_failed(ctx, raised if raised is not None else Cancelled("no cancel request"))

    def _observe_cancellations(self) -> None:
        with self._lock:
            held = {r: c for r, c in self._contexts.items() if not c.cancel_requested}
        if not held:
            return
        ids = list(held)

        def read(conn):
            stmt = select(runs_t.c.run_id).where(runs_t.c.run_id.in_(ids),
                                                 runs_t.c.cancel_requested_at_ms.is_not(None))
            return [r[0] for r in conn.execute(stmt)]

        now = self.store.clock.now_ms()
        if self._member_calls is None:
            found = _read(self.store, read, "worker_cancellations")
        else:  # a member that does not answer is asked again at the next look
            found = [r for rows in self._read_members(read, "worker_cancellations")[0].values() for r in rows]
        for run_id in found:
            # Acknowledge at once (within one interval of the request), before the function notices.
            self.store.runs.acknowledge_cancel(run_id, self.owner, now)
            held[run_id]._cancelled.set()


def _pause(seconds: float, lease: Lease | None, stop_deadline: Callable[[], float | None]) -> None:
    """Sleep ``seconds``, ending early once ``lease`` is lost (the next attempt then refuses) or at
    ``stop_deadline()``, the end of the worker's stop grace once it is stopping."""
    end = time.monotonic() + seconds
    while lease is None or not lease.lost:
        until = stop_deadline()
        left = (end if until is None else min(end, until)) - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.02))


def _check_arguments(store: Any, fn: Any, owner: Any, concurrency: Any, liveness: Any, run_prefix: Any) -> None:
    """Refuse a bad ``Worker`` argument with a ``ValueError`` naming it (never its value)."""
    from fencepost._store import Store
    from fencepost.shards import ShardSet

    if not isinstance(store, (Store, ShardSet)):
        raise ValueError("store must be a fencepost Store or ShardSet")
    problem = fn_problem(fn)
    if problem:
        raise ValueError(f"fn {problem}")
    if owner is not None:
        problem = owner_problem(owner)
        if problem:
            raise ValueError(f"owner {problem}")
    if type(concurrency) is not int or concurrency < 1:
        raise ValueError("concurrency must be an integer >= 1")
    if liveness is not None and not callable(liveness):
        raise ValueError("liveness must be callable or None")
    if run_prefix is not None:
        problem = identifier_problem(run_prefix)
        if problem:
            raise ValueError(f"run_prefix {problem}")


def fn_problem(fn: Any) -> str | None:
    """Why ``fn`` cannot be a run function, or None (the CLI's ``--task`` check shares it)."""
    if not callable(fn):
        return "must be callable (it is called with each run's RunContext)"
    if inspect.iscoroutinefunction(fn):
        return "must be a plain function, not async def (the worker calls it synchronously, on its threads)"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a callable Python cannot describe (some built-ins): it is called as it is
    try:
        signature.bind(None)
    except TypeError:
        return (f"must accept one positional argument, the run's RunContext (it takes {_parameters(signature)}): "
                "def work(ctx): ...")
    return None


def _parameters(signature: inspect.Signature) -> str:
    """``signature`` by its parameters' names and kinds only: a default value (a credential kept as
    one) and an annotation are never part of an error."""
    bare = inspect.Parameter.empty
    return str(signature.replace(
        parameters=[p.replace(default=bare, annotation=bare) for p in signature.parameters.values()],
        return_annotation=inspect.Signature.empty))


#: Seconds a sweep over a shard set waits for a member (its read, or the taking of its runs) before
#: it goes on without it; the member is left out of the sweeps until that call returns.
MEMBER_WAIT_S = 1.0


class _MemberCall:
    """One call on a shard-set member, made on a thread of its own (a daemon: a call that never
    returns must not keep the process alive); ``done`` is set once it returned."""

    def __init__(self, fn: Callable[[], Any], kind: str, finished: Callable[[_MemberCall], None]) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.kind = kind
        self._fn = fn
        self._finished = finished
        threading.Thread(target=self._run, name=f"fencepost-member-{kind}", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # handed to the sweep (or dropped when it has gone on)
            self.error = exc
        finally:
            self._finished(self)
            self.done.set()


class _MemberCalls:
    """A worker's calls on the members of its shard set: each call on a thread of its own, every
    member at once, each waited for ``MEMBER_WAIT_S`` at most. A member whose call has not returned
    yet is left out of later calls, so at most one call per member is ever outstanding, however
    many sweeps go by. Its first stall is logged naming the member, and its return once it
    answers again. (A single store is never called this way: its reads stay on the sweeping thread.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: dict[str, _MemberCall] = {}
        self._stalled: set[str] = set()

    def busy(self, kind: str) -> int:
        """How many members are still busy with a call of ``kind``."""
        with self._lock:
            return sum(1 for call in self._busy.values() if call.kind == kind)

    def call(self, calls: Mapping[str, Callable[[], Any]],
             kind: str) -> tuple[dict[str, Any], dict[str, BaseException], list[str]]:
        """``calls[name]()`` for every member at once: what each member answered within
        ``MEMBER_WAIT_S``, what each one that failed in time raised, and the members left out."""
        started: dict[str, _MemberCall] = {}
        left_out: list[str] = []
        with self._lock:
            for name, fn in calls.items():
                if name in self._busy:
                    left_out.append(name)
                    continue
                started[name] = self._busy[name] = _MemberCall(fn, kind, partial(self._finished, name))
        until = time.monotonic() + MEMBER_WAIT_S
        answers: dict[str, Any] = {}
        failures: dict[str, BaseException] = {}
        for name, call in started.items():
            if not call.done.wait(max(0.0, until - time.monotonic())):
                left_out.append(name)
                with self._lock:
                    first = name not in self._stalled
                    self._stalled.add(name)
                if first:
                    log.warning("worker: shard %s did not answer within %s s; its runs wait for it, the other "
                                "shards' are taken meanwhile", one_line(name), MEMBER_WAIT_S)
            elif call.error is not None:
                failures[name] = call.error
            else:
                answers[name] = call.result
        return answers, failures, left_out

    def _finished(self, name: str, call: _MemberCall) -> None:
        """On the member's thread once its call returned: the member is free for the next call."""
        with self._lock:
            if self._busy.get(name) is call:
                del self._busy[name]
            back = call.error is None and name in self._stalled
            if back:
                self._stalled.discard(name)
        if back:
            log.warning("worker: shard %s answers again", one_line(name))


def _members(store: Any) -> list[tuple[str | None, Any]]:
    """The stores a worker sweeps with their names: every shard of a ``ShardSet``, else the one
    store (no name)."""
    if getattr(store, "shard_stores", None) is not None:
        return list(store.items())
    return [(None, store)]


_CANDIDATE_COLUMNS = (
    runs_t.c.created_at_ms, runs_t.c.run_id, runs_t.c.status, runs_t.c.heartbeat_at_ms,
    runs_t.c.owner_host_id, runs_t.c.owner_pid, runs_t.c.owner_nonce,
    runs_t.c.claim_host_id, runs_t.c.claim_pid, runs_t.c.claim_nonce, runs_t.c.claimed_at_ms,
)


def _read(store: Any, fn: Callable[[Any], Any], method: str, name: str | None = None) -> Any:
    """``store.db.read(fn)``, a database failure raised as the run store's error (as its own reads
    do), naming the shard ``name`` (``store``) when the store is one of a shard set's."""
    try:
        return store.db.read(fn)
    except DbFailure as exc:
        err = map_failure(exc, RunStoreError, method, "run")
        if name is not None:
            err.store = name
        raise err from None


def _owner(cand: dict[str, Any], prefix: str) -> OwnerId | None:
    host = cand[f"{prefix}_host_id"]
    if host is None:
        return None
    return OwnerId(host, cand[f"{prefix}_pid"], cand[f"{prefix}_nonce"])
