"""The clock every store operation reads.

Lifecycle stamps (``created_at_ms``, ``started_at_ms``, ``finished_at_ms``) and the skew bound of the
lease operations read the store's clock, so a composition that takes its ``now_ms`` from the same
clock stamps one row from one source. ``ManualClock`` drives every lease and loop in tests without
wall-clock waits.
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall-clock milliseconds since the epoch, floored to an integer."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class Steady:
    """Milliseconds for pacing what is due on ``clock``: its readings forward, real time otherwise.

    A wall clock stepped backwards (an NTP correction) would hold back everything paced on it for as
    long as the step: no heartbeat, no lease deadline, no cancel poll. Here a reading that went back
    counts as the real time that passed since the last one (``time.monotonic``), so the pace goes on
    while the clock's own readings still stamp every write. A clock that only moves forward (a
    ``ManualClock``) paces exactly as it reads, so tests drive every wait by advancing it. A forward
    step is followed: whatever it makes due comes early, never late.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # Set by the first reading, which the pace starts from (the clock is not read before then).
        self._wall: int | None = None
        self._real = 0.0
        self._paced = 0

    def read(self) -> tuple[int, int]:
        """The clock's reading (to stamp a write with) and the pace's (to compare deadlines with)."""
        wall = self._clock.now_ms()
        real = time.monotonic()
        with self._lock:
            if self._wall is None:
                self._paced = wall
            elif wall >= self._wall:
                self._paced += wall - self._wall
            else:  # stepped back: count the real time since the last reading instead
                self._paced += max(0, math.floor((real - self._real) * 1000))
            self._wall, self._real = wall, real
            return wall, self._paced

    def now_ms(self) -> int:
        """The pace's reading: never less than an earlier one."""
        return self.read()[1]


def _finite(value: object, name: str) -> float:
    """``value`` as a float when it is a finite int or float (never a bool): a NaN or an infinity
    stored in a manual clock would break every later reading."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"{name} must be a finite number of milliseconds, not {type(value).__name__}")
    try:
        exact = float(value)
    except OverflowError:
        exact = math.inf
    if not math.isfinite(exact):
        raise ValueError(f"{name} must be a finite number of milliseconds, not NaN or an infinity")
    return exact


class ManualClock:
    """A clock that moves only when told to; ``sleep`` returns once it is advanced past the deadline."""

    def __init__(self, start_ms: float = 0) -> None:
        self._now = _finite(start_ms, "ManualClock: start_ms")
        self._cond = threading.Condition()

    def now_ms(self) -> int:
        with self._cond:
            return math.floor(self._now)

    def now_exact(self) -> float:
        with self._cond:
            return self._now

    def advance(self, ms: float) -> int:
        """Move the clock forward by ``ms`` milliseconds and wake sleepers whose deadline passed."""
        ms = _finite(ms, "advance: ms")
        if ms < 0:
            raise ValueError("advance: ms must be non-negative")
        with self._cond:
            self._now += ms
            self._cond.notify_all()
            return math.floor(self._now)

    def set(self, ms: float) -> int:
        """Set the clock to ``ms`` (it may not move backwards)."""
        ms = _finite(ms, "set: ms")
        with self._cond:
            if ms < self._now:
                raise ValueError("set: a manual clock does not move backwards")
            self._now = float(ms)
            self._cond.notify_all()
            return math.floor(self._now)

    def sleep(self, seconds: float) -> None:
        """Block until the clock has been advanced ``seconds`` past the time of the call."""
        with self._cond:
            deadline = self._now + seconds * 1000.0
            while self._now < deadline:
                self._cond.wait()
