"""Ownership supervision: the owner's half of the heartbeat lease (seed leases.md, "The supervision loop").

A supervisor pulses ``heartbeat`` every ``HEARTBEAT_INTERVAL`` and tells two failures apart on
purpose:

- **a lost fence** is any pulse outcome other than ``Updated``: durable evidence that another owner
  holds the run, so the lease is interrupted at once (``on_lapse`` is *not* called);
- **a failed write** is evidence of nothing: the persisted heartbeat is still on the row and no peer
  may steal the run until it is ``STALE_AFTER`` old, so write errors are tolerated for
  ``WRITE_TOLERANCE``, counted from the timestamp *sent* with the last confirmed pulse (or from the
  start of supervision before the first one). When that budget is spent, ``runs.reconfirm`` gets one
  ``HEARTBEAT_INTERVAL``; success journals a ``flows.engine.run-decision`` entry with decision
  ``lease-reconfirmed`` on the run's own stream and calls ``on_reconfirm(unconfirmed_ms)``, and
  supervision carries on; failure, an error or a timeout calls ``on_lapse(unconfirmed_ms)`` and
  interrupts.

One supervisor thread serves any number of runs of one owner: with more than one lease held it renews
them all with one ``runs.heartbeat_many`` per interval. Every store call runs on a helper thread and is
waited for against the clock, so a write that never returns cannot hold the deadline back, and the
whole loop runs under ``ManualClock`` without wall-clock waits.

What is due (a pulse, a lease's deadline, a reconfirm's answer) is paced on ``Supervisor.steady``
(``fencepost.clock.Steady``), which follows the store's clock forward but never back: a wall clock
stepped backwards would otherwise silence every lease for as long as the step. Every write is
stamped with the store clock's own reading, and lease times (``confirmed_ms``, ``deadline_ms``,
``unconfirmed_ms``) are on the pace, which reads as the store clock until that clock steps back.

Two front ends share it: ``async with supervise(...)`` cancels the owned asyncio task when the lease
is lost (and turns that cancellation into ``LeaseLost``); ``LeaseKeeper`` serves threaded code,
whose ``check()`` raises ``LeaseLost`` at the caller's next safe point.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fencepost._values import is_safe_int
from fencepost.clock import Steady
from fencepost.errors import RunStoreError
from fencepost.journal.owner import OwnerId
from fencepost.runstore import _checks as check
from fencepost.runstore._tracebacks import logged_traceback, store_redaction
from fencepost.runstore.heartbeat import HEARTBEAT_INTERVAL, STALE_AFTER, WRITE_TOLERANCE
from fencepost.runstore.liveness import LivenessContext, lease_liveness, same_host_pid_probe
from fencepost.runstore.outcomes import Updated

__all__ = [
    "HEARTBEAT_INTERVAL",
    "STALE_AFTER",
    "WRITE_TOLERANCE",
    "Lease",
    "LeaseKeeper",
    "LeaseLost",
    "LivenessContext",
    "Supervisor",
    "lease_liveness",
    "same_host_pid_probe",
    "supervise",
]

log = logging.getLogger("fencepost.ownership")

INTERVAL_MS = int(HEARTBEAT_INTERVAL.total_seconds() * 1000)
TOLERANCE_MS = int(WRITE_TOLERANCE.total_seconds() * 1000)

ENGINE_SOURCE_ID = "flows.engine"
RUN_DECISION = "flows.engine.run-decision"

# How often a wait re-reads the clock. A ManualClock cannot wake a waiter, so waits poll it; this
# is the only wall-clock constant in the loop and it bounds reaction latency, never a lease.
_POLL_S = 0.005
# How long ``settle()`` waits for a heartbeat in flight before it takes it for hung (a test's store
# that never answers). Long enough for a real write on a loaded machine, where 0.2 s was not: the
# test moved its clock on before the answer was in, and the renewal it expected never came.
_HUNG_S = 1.0

LapseCallback = Callable[[int], Any]


def _is_async(fn: object) -> bool:
    # An object whose class defines ``async def __call__`` is a coroutine function too.
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


def _check_hook(value: object, method: str, field: str, *, coroutines: bool = False) -> None:
    """A hook is ``None`` or a callable; a coroutine function only where a loop will await it."""
    if value is None:
        return
    if not callable(value):
        raise check.refuse(method, f"{field} must be a callable or None", {"field": field})
    if not coroutines and _is_async(value):
        raise check.refuse(method, f"{field} must be a plain function: a coroutine function is never awaited "
                           "on the supervisor thread (supervise() awaits one on its event loop)", {"field": field})


def _check_clock(clock: object, method: str) -> None:
    if clock is not None and not callable(getattr(clock, "now_ms", None)):
        raise check.refuse(method, "clock must be a Clock (an object with now_ms()) or None", {"field": "clock"})


def _check_hold(run_id: object, on_lapse: object, on_reconfirm: object, on_lost: object, method: str, *,
                coroutines: bool = False) -> None:
    check.run_id(run_id, method)
    _check_hook(on_lapse, method, "on_lapse", coroutines=coroutines)
    _check_hook(on_reconfirm, method, "on_reconfirm", coroutines=coroutines)
    _check_hook(on_lost, method, "on_lost")


class LeaseLost(Exception):
    """The lease on ``run_id`` is gone: the fence was lost (``reason`` = the outcome tag) or it lapsed.

    ``unconfirmed_ms`` is set when the lease lapsed after write failures (``reason == "lapsed"``).
    """

    def __init__(self, run_id: str, reason: str, unconfirmed_ms: int | None = None) -> None:
        self.run_id = run_id
        self.reason = reason
        self.unconfirmed_ms = unconfirmed_ms
        detail = f" after {unconfirmed_ms} ms unconfirmed" if unconfirmed_ms is not None else ""
        super().__init__(f"lease lost ({reason}){detail}")

    def __reduce__(self):
        return (type(self), (self.run_id, self.reason, self.unconfirmed_ms))


class _Call:
    """A store call on a helper thread, so the loop can stop waiting for it at a deadline."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.began: float | None = None  # set when the helper thread starts the call
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        threading.Thread(target=self._run, name="fencepost-lease-call", daemon=True).start()

    def _run(self) -> None:
        self.began = time.monotonic()
        try:
            self.result = self._fn()
        except BaseException as exc:  # reported to the loop, which decides what a failure means
            self.error = exc
        finally:
            self.done.set()


class Lease:
    """One run held under a ``Supervisor``: ``check()`` raises ``LeaseLost`` once it is gone."""

    def __init__(self, supervisor: Supervisor, run_id: str, on_lapse: LapseCallback | None,
                 on_reconfirm: LapseCallback | None, on_lost: Callable[[Lease], None] | None,
                 started_ms: int) -> None:
        self.supervisor = supervisor
        self.run_id = run_id
        self._on_lapse = on_lapse
        self._on_reconfirm = on_reconfirm
        self._on_lost = on_lost
        # The budget counts from the timestamp sent with the last confirmed pulse; before the first
        # one it starts with supervision (seed leases.md).
        self.confirmed_ms = started_ms
        self.error: LeaseLost | None = None
        self.released = False
        self.reconfirmations = 0
        self._failing = False

    @property
    def lost(self) -> bool:
        """True once the fence was lost or the lease lapsed."""
        return self.error is not None

    @property
    def deadline_ms(self) -> int:
        """When the write budget runs out, on the supervisor's pace (``supervisor.steady.now_ms()``)."""
        return self.confirmed_ms + TOLERANCE_MS

    def check(self) -> None:
        """Raise ``LeaseLost`` if the lease is gone; call it between units of owned work.

        After ``release()`` nothing renews the lease and no loss could be noticed, so ``check()``
        raises ``RunStoreError`` ``invalid_run`` instead of passing (as ``LeaseKeeper.check()`` does
        once stopped); a lease lost before it was released keeps raising ``LeaseLost``.
        """
        if self.error is not None:
            raise self.error
        if self.released:
            raise check.refuse("Lease.check", "the lease was released: nothing renews it any more "
                               "(hold the run again for a new lease)", {"field": "state"})

    def release(self) -> None:
        """Stop renewing this run (call it before settling, or when the work is abandoned)."""
        self.supervisor._release(self)


class Supervisor:
    """The heartbeat loop for every run one owner holds, on one background thread.

    ``hold(run_id, ...)`` starts supervising a run the owner has just activated and returns its
    ``Lease``. With one lease held a pulse is ``runs.heartbeat``; with several, one
    ``runs.heartbeat_many`` renews them all in one write transaction, with the same per-run outcomes.
    """

    def __init__(self, store: Any, owner: OwnerId, *, clock: Any = None, journal_reconfirm: bool = True) -> None:
        check.owner(owner, "Supervisor")
        _check_clock(clock, "Supervisor")
        self.store = store
        self.owner = owner
        self.clock = clock if clock is not None else store.clock
        self.steady = Steady(self.clock)  # paces what is due; ``clock`` stamps the writes
        self.journal_reconfirm = journal_reconfirm
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()  # one loop thread, however many threads call start()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._leases: dict[str, Lease] = {}
        self._pulse: _Call | None = None
        self._pulse_sent = 0
        self._pulse_leases: list[Lease] = []
        self._receipts: list[tuple[Lease, _Call, int, int]] = []
        self._next_pulse_ms: int | None = None
        self._thread: threading.Thread | None = None
        self._restart = False  # a hook on the loop held a run after stop() was asked for
        self._idle = threading.Condition()
        self._idle_at: int | None = None
        self.pulses = 0
        self.failed_pulses = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Supervisor:
        """Start the loop thread (idempotent). A stopped supervisor starts again: ``hold`` after
        ``stop`` (a ``Worker`` run again) pulses as before, never silently not at all.

        From another thread, a loop that is stopping is waited for first, so two loops never pulse
        at once. From a hook on the loop itself (a ``hold`` in ``on_lapse``), nothing is waited for:
        a stop already asked for still ends this loop, which then hands over to a fresh one, unless
        ``stop()`` is called again meanwhile (the later call wins). The stop is never undone from
        inside the loop, so a thread waiting for it to end is never left waiting forever.
        """
        me = threading.current_thread()
        while True:
            with self._start_lock:
                thread = self._thread
                if thread is me:  # a hook on the loop
                    if self._stop.is_set():
                        self._restart = True
                    return self
                if thread is None:
                    self._stop.clear()
                    self._restart = False
                    self._spawn()
                    return self
                if thread.is_alive() and not self._stop.is_set():
                    return self
            # The loop is stopping (or died): wait for it outside the lock, since it takes the
            # lock to hand over as it ends; then look again (it may have handed over meanwhile).
            thread.join()
            with self._start_lock:
                if self._thread is thread:
                    self._thread = None

    def _spawn(self) -> None:
        # Under ``_start_lock``.
        self._thread = threading.Thread(target=self._run, name="fencepost-supervisor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._start_lock:
                # A hook held a run after the stop was asked for, and nobody stopped since: the
                # held leases are pulsed by a fresh loop, started only now that this one is done.
                if self._restart and self._thread is threading.current_thread():
                    self._restart = False
                    self._stop.clear()
                    self._spawn()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop pulsing; held leases simply stop being renewed (they are not released in the store)."""
        thread = self._ask_stop()
        if thread is not None:
            thread.join(timeout)

    def _ask_stop(self) -> threading.Thread | None:
        """Tell the loop to stop, without waiting: the loop thread to wait for, if it is another.

        Safe to call on an event loop: ``_start_lock`` is only ever held briefly (never while a
        thread is joined or a store call runs), and nothing here waits (measured: microseconds)."""
        with self._start_lock:
            self._restart = False
            self._stop.set()
            thread = self._thread
        self._wake.set()
        return thread if thread is not None and thread is not threading.current_thread() else None

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def hold(self, run_id: str, *, on_lapse: LapseCallback | None = None,
             on_reconfirm: LapseCallback | None = None,
             on_lost: Callable[[Lease], None] | None = None, verify: bool = True,
             since_ms: int | None = None) -> Lease:
        """Supervise ``run_id``, owned by this supervisor's owner, from now on.

        ``on_lapse(unconfirmed_ms)`` runs when write failures outlast ``WRITE_TOLERANCE`` and reconfirm
        fails; ``on_reconfirm(unconfirmed_ms)`` after a successful reconfirm (it must finish within the
        renewed budget, or the lease lapses); ``on_lost(lease)`` whenever the lease is gone, for either
        cause. Callbacks run on the supervisor thread, so they are plain functions: a bad run id or a
        hook that is not callable (or a coroutine function) is ``RunStoreError`` ``invalid_run``
        before anything starts, and so is a run this supervisor already holds under a live lease
        (one lease per run: release the first, or keep using it).

        With ``verify`` (the default) one read checks that the owner holds the run: a run that does
        not exist raises ``LeaseLost`` with reason ``NotFound``, one held by another owner (or settled)
        ``FenceLost``, the answers the first pulse would give one interval later. Pass
        ``verify=False`` only right after activating the run yourself.

        ``since_ms`` counts the lease from that store-clock reading instead of from now (a reading
        taken before activating the run, so the lease never outlasts the one the store counts from
        the activation's heartbeat); a reading later than now counts from now. It must be a
        non-negative integer, else ``invalid_run``. The lease starts that long before now on the pace
        (``steady``), so a clock that stepped back since the reading never lengthens it.
        """
        method = "Supervisor.hold"
        _check_hold(run_id, on_lapse, on_reconfirm, on_lost, method)
        if since_ms is not None and not is_safe_int(since_ms):
            raise check.refuse(method, "since_ms must be a non-negative safe integer", {"field": "since_ms"})
        self._refuse_held(run_id, method)
        if verify:
            verify_owned(self.store, run_id, self.owner)
        wall, paced = self.steady.read()
        lease = Lease(self, run_id, on_lapse, on_reconfirm, on_lost,
                      paced if since_ms is None else paced - max(0, wall - since_ms))
        with self._lock:
            if self._is_held(run_id):  # another thread held it meanwhile
                raise _already_held(method)
            self._leases[run_id] = lease
            if self._next_pulse_ms is None:
                self._next_pulse_ms = lease.confirmed_ms + INTERVAL_MS
        self.start()
        self._wake.set()
        return lease

    def _is_held(self, run_id: str) -> bool:
        current = self._leases.get(run_id)
        return current is not None and current.error is None and not current.released

    def _refuse_held(self, run_id: str, method: str) -> None:
        with self._lock:
            if self._is_held(run_id):
                raise _already_held(method)

    def held(self) -> list[str]:
        """The run ids currently supervised and not lost."""
        with self._lock:
            return [r for r, lease in self._leases.items() if lease.error is None]

    def _release(self, lease: Lease) -> None:
        with self._lock:
            lease.released = True
            if self._leases.get(lease.run_id) is lease:
                del self._leases[lease.run_id]
                if not self._leases:
                    self._next_pulse_ms = None
        self._wake.set()

    def settle(self, timeout: float = 5.0) -> None:
        """Block until the loop has handled everything due at the clock's current reading.

        For tests driving a ``ManualClock``: advance the clock, then ``settle()`` before asserting.
        A heartbeat still unanswered after a second is taken for hung (a test's store that never
        answers), and no longer waited for.
        """
        if self._thread is None:  # never started: no loop, nothing to settle
            return
        target = self.steady.now_ms()
        self._wake.set()
        end = time.monotonic() + timeout
        with self._idle:
            while not (self._stop.is_set() or self._settled(target)):
                if time.monotonic() > end:
                    raise TimeoutError("supervisor did not settle")
                self._idle.wait(0.01)

    def _settled(self, target: int) -> bool:
        if self._idle_at is None or self._idle_at < target:
            return False
        pulse = self._pulse
        # A pulse still in flight after a short grace is treated as hung: the loop is waiting on
        # the clock for it, which is exactly the idle state a test wants to observe.
        young = time.monotonic() - _HUNG_S
        if any(r[1].done.is_set() or r[1].began is None or r[1].began > young for r in self._receipts):
            return False
        return pulse is None or (not pulse.done.is_set() and pulse.began is not None and pulse.began < young)

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while not self._stop.is_set():
            # ``now`` paces (compared with deadlines); ``stamp`` is the store clock's reading, written.
            stamp, now = self.steady.read()
            self._collect_pulse(now)
            self._collect_receipts(now)
            self._check_deadlines(now, stamp)
            self._maybe_pulse(now, stamp)
            self._wait(now)

    def _wait(self, now: int) -> None:
        with self._lock:
            wake_at: list[int] = [lease.deadline_ms for lease in self._leases.values() if lease.error is None]
            if self._pulse is None and self._next_pulse_ms is not None:
                wake_at.append(self._next_pulse_ms)
            wake_at += [r[3] for r in self._receipts]
        until = min(wake_at) if wake_at else None
        with self._idle:
            self._idle_at = now
            self._idle.notify_all()
        self._wake.clear()
        while not self._stop.is_set():
            if self._pulse is not None and self._pulse.done.is_set():
                break
            if any(r[1].done.is_set() for r in self._receipts):
                break
            if self._wake.wait(_POLL_S):
                break
            if until is not None and self.steady.now_ms() >= until:
                break
        with self._idle:
            self._idle_at = None

    def _maybe_pulse(self, now: int, stamp: int) -> None:
        with self._lock:
            if self._pulse is not None or self._next_pulse_ms is None or now < self._next_pulse_ms:
                return
            # A pulse past a lease's deadline must not renew it: that lease goes to reconfirm.
            due = [lease for lease in self._leases.values() if lease.error is None and now < lease.deadline_ms]
            if not due:
                self._next_pulse_ms = now + INTERVAL_MS
                return
            # Keep the Lease objects, not the ids: a run released and held again meanwhile gets a
            # new Lease, which an answer to this older pulse must not touch.
            self._pulse_leases = due
            self._pulse_sent = now
            ids = [lease.run_id for lease in due]
        runs, owner = self.store.runs, self.owner
        if len(ids) == 1:
            run_id = ids[0]
            self._pulse = _Call(lambda: {run_id: runs.heartbeat(run_id, owner, stamp)})
        else:
            self._pulse = _Call(lambda: _as_mapping(ids, runs.heartbeat_many(owner, ids, stamp)))
        self.pulses += 1

    def _collect_pulse(self, now: int) -> None:
        call = self._pulse
        if call is None or not call.done.is_set():
            return
        self._pulse = None
        sent = self._pulse_sent
        with self._lock:
            # Spaced pulses: the next one is one interval after this one finished, never a burst.
            self._next_pulse_ms = now + INTERVAL_MS if self._leases else None
            leases = list(self._pulse_leases)
        outcomes: dict[str, Any] = call.result
        if call.error is not None:
            self.failed_pulses += 1
            # A shard set's ``heartbeat_many`` commits shard by shard: its error carries the outcomes
            # of the shards that committed (``results``). Those leases were renewed; the rest failed.
            partial = getattr(call.error, "results", None)
            outcomes = partial if isinstance(partial, dict) else {}
            for lease in leases:
                if lease.run_id in outcomes:
                    continue
                if lease.error is None and not lease.released and not lease._failing:
                    lease._failing = True
                    log.warning("run %s: heartbeat write failed", lease.run_id,
                                extra={"run_id": lease.run_id, "code": getattr(call.error, "code", None)
                                       or getattr(call.error, "category", "persistence_failed")})
            leases = [lease for lease in leases if lease.run_id in outcomes]
        for lease in leases:
            if lease.error is not None or lease.released:
                continue
            outcome = outcomes.get(lease.run_id)
            if isinstance(outcome, Updated):
                # Re-arm from the stamp sent, not from when the write finished: a delayed success
                # cannot stretch the budget past what the persisted heartbeat covers.
                lease.confirmed_ms = max(lease.confirmed_ms, sent)
                lease._failing = False
            else:
                self._lose(lease, LeaseLost(lease.run_id, type(outcome).__name__), lapse=False)

    def _check_deadlines(self, now: int, stamp: int) -> None:
        with self._lock:
            due = [lease for lease in self._leases.values() if lease.error is None and now >= lease.deadline_ms]
        if not due:
            return
        owner, runs = self.owner, self.store.runs
        calls = [(lease, _Call(functools.partial(runs.reconfirm, lease.run_id, owner, stamp))) for lease in due]
        answer_by = now + INTERVAL_MS
        for lease, call in calls:
            unconfirmed = now - lease.confirmed_ms
            if not self._wait_call(call, answer_by) or call.error is not None:
                self._lapse(lease, unconfirmed)
                continue
            if not isinstance(call.result, Updated):
                # The store answered: the fence is gone, and the answer says why (an owner frozen
                # past its lease, then resumed, finds that a peer took the run meanwhile).
                self._lapse(lease, unconfirmed, type(call.result).__name__)
                continue
            lease.confirmed_ms = max(lease.confirmed_ms, now)
            lease._failing = False
            lease.reconfirmations += 1
            # The receipt (journal entry, then the caller's hook) must finish inside the renewed
            # budget; reconfirmation time is already subtracted because the budget counts from ``now``.
            # It runs beside the loop, so a slow hook never holds back the pulses of other runs.
            receipt = _Call(functools.partial(self._receipt, lease, unconfirmed))
            self._receipts.append((lease, receipt, unconfirmed, lease.deadline_ms))

    def _collect_receipts(self, now: int) -> None:
        pending = []
        for lease, call, unconfirmed, deadline in self._receipts:
            if call.done.is_set():
                if call.error is not None:
                    self._lapse(lease, unconfirmed)
            elif now >= deadline or lease.released:
                # A blocked receipt lapses the lease at the renewed deadline (seed leases.md).
                if not lease.released:
                    self._lapse(lease, unconfirmed)
            else:
                pending.append((lease, call, unconfirmed, deadline))
        self._receipts = pending

    def _receipt(self, lease: Lease, unconfirmed_ms: int) -> None:
        if self.journal_reconfirm:
            self.store.journal.append(
                lease.run_id, RUN_DECISION,
                {"decision": "lease-reconfirmed", "detail": {"unconfirmedMs": unconfirmed_ms}},
                owner=self.owner, source_id=ENGINE_SOURCE_ID,
            )
        if lease._on_reconfirm is not None:
            try:
                lease._on_reconfirm(unconfirmed_ms)
            except BaseException as exc:
                # The receipt did not finish, so the lease lapses (``_collect_receipts``): say why.
                _log_callback_failure(self.store, lease.run_id, exc)
                raise

    def _wait_call(self, call: _Call, deadline_ms: int) -> bool:
        while not call.done.wait(_POLL_S):
            if self._stop.is_set() or self.steady.now_ms() >= deadline_ms:
                return call.done.is_set()
        return True

    def _lapse(self, lease: Lease, unconfirmed_ms: int, outcome: str | None = None) -> None:
        """The lease ran out of budget: ``outcome`` is the reconfirm's answer when the store gave one
        (the log line then says what happened), None when the reconfirm failed or never answered."""
        extra = {"run_id": lease.run_id, "unconfirmed_ms": unconfirmed_ms}
        if outcome is None:
            log.warning("run %s: lease lapsed; interrupting owned work", lease.run_id, extra=extra)
        else:
            what = _GONE.get(outcome, "the store refused to renew it")
            log.warning("run %s: lease lost after %d ms unconfirmed: %s (reconfirm answered %s); interrupting "
                        "owned work", lease.run_id, unconfirmed_ms, what, outcome, extra={**extra, "outcome": outcome})
        self._lose(lease, LeaseLost(lease.run_id, "lapsed", unconfirmed_ms), lapse=True)

    def _lose(self, lease: Lease, error: LeaseLost, *, lapse: bool) -> None:
        with self._lock:
            if lease.error is not None or lease.released:
                return
            lease.error = error
        if lapse and lease._on_lapse is not None:
            _call_quietly(self.store, lease.run_id, lease._on_lapse, error.unconfirmed_ms)
        if lease._on_lost is not None:
            _call_quietly(self.store, lease.run_id, lease._on_lost, lease)


# What a reconfirm's answer says happened to a run whose lease ran out of budget.
_GONE = {
    "FenceLost": "another owner took the run meanwhile (or it was settled or released)",
    "NotFound": "the run no longer exists",
}


def _already_held(method: str) -> Exception:
    return check.refuse(method, "run_id is already held by this supervisor under a live lease "
                        "(one lease per run: release it before holding the run again)", {"field": "run_id"})


def verify_owned(store: Any, run_id: str, owner: OwnerId) -> None:
    """One read: raise ``LeaseLost`` unless ``owner`` holds ``run_id`` now.

    ``NotFound`` when the run does not exist, ``FenceLost`` when another owner holds it or nobody
    does (pending, claimed, settled): the outcome tags the first heartbeat would answer.
    """
    try:
        row = store.runs.get(run_id)
    except RunStoreError as exc:
        if exc.code == "not_found_row":
            raise LeaseLost(run_id, "NotFound") from None
        raise
    if row.owner != owner:
        raise LeaseLost(run_id, "FenceLost")


def _log_callback_failure(store: Any, run_id: str, exc: BaseException) -> None:
    """A supervision callback raised: its traceback, redacted as a failed run's is, as text (never
    ``exc_info``: a handler that formats the exception itself would print every message verbatim)."""
    log.error("run %s: supervision callback failed\n%s", run_id,
              logged_traceback(exc, store_redaction(store, run_id)), extra={"run_id": run_id})


def _call_quietly(store: Any, run_id: str, fn: Callable[..., Any], *args: Any) -> None:
    try:
        result = fn(*args)
    except Exception as exc:  # a failing user hook must not stop the loop that keeps other leases alive
        _log_callback_failure(store, run_id, exc)
        return
    if inspect.iscoroutine(result):  # a plain function that returned a coroutine: nothing awaits it here
        result.close()
        log.error("supervision callback returned a coroutine, which was not awaited")


def _as_mapping(run_ids: list[str], result: Any) -> dict[str, Any]:
    """``heartbeat_many`` answers per run: accept a mapping or a sequence in request order."""
    if isinstance(result, dict):
        return result
    return dict(zip(run_ids, result, strict=True))


class LeaseKeeper:
    """Threaded supervision of one run: ``check()`` raises ``LeaseLost`` once the lease is gone.

    Use it as a context manager around the owned work and call ``check()`` between units of work
    (before each side effect): the keeper cannot stop a thread, it can only refuse to let it go on.
    """

    def __init__(self, store: Any, run_id: str, owner: OwnerId, *, on_lapse: LapseCallback | None = None,
                 on_reconfirm: LapseCallback | None = None, clock: Any = None) -> None:
        check.owner(owner, "LeaseKeeper")
        _check_hold(run_id, on_lapse, on_reconfirm, None, "LeaseKeeper")
        _check_clock(clock, "LeaseKeeper")
        self.supervisor = Supervisor(store, owner, clock=clock)
        self.run_id = run_id
        self._on_lapse = on_lapse
        self._on_reconfirm = on_reconfirm
        self.lease: Lease | None = None

    def start(self) -> LeaseKeeper:
        """Begin pulsing (the budget starts now); after ``stop()``, with a new lease."""
        if self.lease is None or self.lease.released:
            self.lease = self.supervisor.hold(self.run_id, on_lapse=self._on_lapse, on_reconfirm=self._on_reconfirm)
        return self

    def stop(self) -> None:
        """Stop pulsing (does not release the run in the store: settle it with ``transition_owned``)."""
        if self.lease is not None:
            self.lease.release()
        self.supervisor.stop()

    @property
    def lost(self) -> bool:
        return self.lease is not None and self.lease.lost

    def check(self) -> None:
        """Raise ``LeaseLost`` if the fence was lost or the lease lapsed.

        A keeper that is not keeping the lease, never started or stopped since (the ``with`` block
        left), raises ``RunStoreError`` ``invalid_run`` instead of answering as if it were: nothing
        renews the lease then, and no loss could ever be noticed. A lease lost before ``stop()``
        keeps raising ``LeaseLost``.
        """
        lease = self.lease
        if lease is not None and lease.error is not None:
            raise lease.error
        if lease is None or lease.released:
            raise check.refuse("LeaseKeeper.check", "the keeper is not keeping the lease (never started, or "
                               "stopped): call start() or enter it with `with` before check()", {"field": "state"})

    def settle(self, timeout: float = 5.0) -> None:
        """Wait until the loop has handled the clock's current reading (for ``ManualClock`` tests)."""
        self.supervisor.settle(timeout)

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.asynccontextmanager
async def supervise(store: Any, run_id: str, owner: OwnerId, on_lapse: LapseCallback | None = None,
                    on_reconfirm: LapseCallback | None = None, *,
                    supervisor: Supervisor | None = None) -> AsyncIterator[Lease]:
    """Supervise ``run_id`` while the body runs; cancel the current task if the lease is lost.

    The cancellation surfaces as ``LeaseLost`` from the ``async with`` block; so does a loss while the
    body ran without awaiting (the block ends with ``LeaseLost`` instead of normally). A lost fence
    (any pulse outcome other than ``Updated``) interrupts at once without ``on_lapse``; a lapse after
    ``WRITE_TOLERANCE`` of write failures and a failed reconfirm calls ``on_lapse(unconfirmed_ms)``
    first. Either hook may be a coroutine function: an async ``on_lapse`` is awaited by the block
    after the body was interrupted, before ``LeaseLost`` is raised; an async ``on_reconfirm`` runs on
    this event loop while the body goes on, and must finish within the renewed budget. Plain hooks
    run on the supervisor thread. Pass a shared ``supervisor`` (of the same ``owner``) to renew many
    runs with one ``heartbeat_many`` per interval. Bad arguments are ``RunStoreError`` ``invalid_run``
    on entry, before the body runs or anything is pulsed.

    The caller's own cancellation (``Task.cancel``, ``asyncio.timeout``, ``wait_for``) goes on as it
    came, also when it meets a lost lease: if the block is interrupted while the lease is lost and the
    task is still being cancelled once the block's own request is undone (``Task.cancelling()``), the
    block raises that ``CancelledError``, not ``LeaseLost``; the ``LeaseLost`` is its ``__context__``
    (an async ``on_lapse`` is still awaited first). Only a cancellation that was the block's alone
    becomes ``LeaseLost``. Without a shared ``supervisor`` the block's own one is stopped on the way
    out whatever cancellation lands there: the stop is asked for on the event loop before anything
    is awaited, and only the wait for its thread to end (a few milliseconds, at most 5 s) can be cut
    short by a cancellation, which then goes on.
    """
    method = "supervise"
    check.owner(owner, method)
    _check_hold(run_id, on_lapse, on_reconfirm, None, method, coroutines=True)
    if supervisor is not None and not isinstance(supervisor, Supervisor):
        raise check.refuse(method, "supervisor must be a Supervisor or None", {"field": "supervisor"})
    if supervisor is not None and supervisor.owner != owner:
        raise check.refuse(method, "owner must be the supervisor's owner", {"field": "owner"})
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("supervise() must run inside an asyncio task")
    loop = asyncio.get_running_loop()
    inside = False  # True while the body runs: a loss cancels the task only then
    cancelled = False

    def cancel_if_inside() -> None:
        nonlocal cancelled
        if inside and not cancelled:
            cancelled = True
            task.cancel()

    def on_lost(lease: Lease) -> None:
        loop.call_soon_threadsafe(cancel_if_inside)

    lapse_hook = None if _is_async(on_lapse) else on_lapse
    reconfirm_hook = on_reconfirm
    if on_reconfirm is not None and _is_async(on_reconfirm):
        async_reconfirm = on_reconfirm

        def reconfirm_hook(unconfirmed_ms: int) -> None:
            # On the receipt's helper thread: run the hook on the loop and wait for it there, so the
            # receipt (and the lease) fails if the hook fails or outlasts the renewed budget.
            coro = async_reconfirm(unconfirmed_ms)
            try:
                future = asyncio.run_coroutine_threadsafe(coro, loop)
            except RuntimeError:  # the loop is closed: the hook cannot run, so the receipt fails
                coro.close()
                raise
            future.result()

    own = supervisor is None
    sup = supervisor if supervisor is not None else Supervisor(store, owner)
    # Off the event loop: the ownership read, and starting a shared supervisor that is stopping
    # (which waits for its old loop thread to end). A cancellation meanwhile releases the lease
    # once the hold is done, so the run is never left pulsing with nobody inside the block.
    entry = _Entry(sup, own)
    try:
        lease = await asyncio.to_thread(entry.hold, run_id, on_lapse=lapse_hook, on_reconfirm=reconfirm_hook,
                                        on_lost=on_lost)
    except BaseException:
        entry.abandon()
        raise
    inside = True
    interrupted: asyncio.CancelledError | None = None
    try:
        try:
            lease.check()  # lost while entering: the body never runs
            yield lease
        except asyncio.CancelledError as exc:
            if lease.error is None:
                raise  # not ours: the caller's cancellation (or timeout) goes on as it came
            interrupted = exc
        inside = False
        error = lease.error
        if error is not None:
            if cancelled:
                task.uncancel()  # our own request is undone; the caller's, if any, still counts
            # The caller cancelled too (a shutdown, a timeout), before or after the loss: their
            # cancellation goes on, carrying the loss as its context, instead of being turned into
            # LeaseLost (a task that handles LeaseLost and moves on would never end).
            callers = interrupted if interrupted is not None and task.cancelling() > 0 else None
            # (a lapse always says how long the lease went unconfirmed)
            lapsed = error.unconfirmed_ms if error.reason == "lapsed" else None
            if lapsed is not None and on_lapse is not None and lapse_hook is None:
                try:
                    await on_lapse(lapsed)
                except Exception as exc:  # as for a plain hook: reported, and LeaseLost still raised
                    _log_callback_failure(store, run_id, exc)
            if callers is not None:
                callers.__context__ = error
                callers.__suppress_context__ = False
                raise callers
            raise error from None
    finally:
        inside = False
        lease.release()
        if own:
            await _stop_own(sup)


async def _stop_own(sup: Supervisor, timeout: float = 5.0) -> None:
    """Stop the supervisor a ``supervise`` block started, whatever cancellation lands meanwhile.

    The stop is asked for at once on the event loop (two events set under a lock no one holds across
    a wait, so the loop is not blocked), never from a helper thread: a cancellation used to cancel
    that call while it sat queued in a busy default executor, and the loop thread then ran for the
    rest of the process. Only the wait for the thread to end is left, polled on the event loop; a
    cancellation ends that wait early and goes on, and the thread ends by itself (it only has to
    notice the stop, or finish a hook it is running)."""
    thread = sup._ask_stop()
    if thread is None:
        return
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    delay = 0.0
    while thread.is_alive() and loop.time() < end:
        await asyncio.sleep(delay)
        delay = min(_POLL_S, delay * 2 or 0.001)


class _Entry:
    """``supervise``'s hold, run on a helper thread; abandoned by a block that stopped waiting for it."""

    def __init__(self, sup: Supervisor, own: bool) -> None:
        self._sup = sup
        self._own = own
        self._lock = threading.Lock()
        self._lease: Lease | None = None
        self._abandoned = False

    def hold(self, run_id: str, **hooks: Any) -> Lease:
        try:
            lease = self._sup.hold(run_id, **hooks)
        except BaseException:
            self._abandon_all()
            raise
        with self._lock:
            if not self._abandoned:
                self._lease = lease
                return lease
        lease.release()
        self._abandon_all()
        return lease

    def abandon(self) -> None:
        """The block gave up on entering (cancelled, or the hold failed): undo whatever was held."""
        with self._lock:
            self._abandoned = True
            lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()
            self._abandon_all()

    def _abandon_all(self) -> None:
        if self._own:
            self._sup.stop(timeout=0)  # its own loop thread ends by itself; nothing waits for it
