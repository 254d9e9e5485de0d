"""Clocks: ManualClock drives time without wall-clock waits."""

from __future__ import annotations

import threading

import pytest

from fencepost.clock import ManualClock, SystemClock


def test_manual_clock_floors_and_moves_only_when_told() -> None:
    clock = ManualClock(10.5)
    assert clock.now_ms() == 10
    assert clock.advance(1) == 11
    assert clock.set(20) == 20
    with pytest.raises(ValueError):
        clock.set(5)
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_manual_sleep_returns_when_advanced_past_deadline() -> None:
    clock = ManualClock(0)
    woke = threading.Event()
    waiting = threading.Event()

    class _Watched(threading.Condition):
        """The clock's condition, telling when the sleeper waits on it (its deadline is set by then:
        advanced before the call, the clock would put the deadline 1 s past the advanced time)."""

        def wait(self, timeout: float | None = None) -> bool:
            waiting.set()
            return super().wait(timeout)

    clock._cond = _Watched()

    def sleeper() -> None:
        clock.sleep(1.0)
        woke.set()

    t = threading.Thread(target=sleeper, daemon=True)
    t.start()
    assert waiting.wait(10)
    clock.advance(999)
    assert not woke.wait(0.05)
    clock.advance(1)
    assert woke.wait(10)
    t.join(10)


def test_system_clock_reads_integer_milliseconds() -> None:
    now = SystemClock().now_ms()
    assert type(now) is int and now > 1_700_000_000_000


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), "5", None, True, [1]], ids=repr)
def test_manual_clock_refuses_a_reading_that_is_no_finite_number_and_keeps_its_time(bad) -> None:
    """No backend: the clock alone. ``advance(nan)`` (or ``set(nan)``, ``advance(inf)``) used to
    store the value, and every later ``now_ms()`` raised ``ValueError: cannot convert float NaN to
    integer``: one bad call broke the clock for the rest of the test. A string or ``None`` gave a bare
    ``TypeError`` from a comparison. Each is now a ``ValueError`` naming the argument, and the clock
    keeps its time."""
    clock = ManualClock(7)
    for call, name in ((lambda: clock.advance(bad), "advance: ms"), (lambda: clock.set(bad), "set: ms"),
                       (lambda: ManualClock(bad), "ManualClock: start_ms")):
        with pytest.raises(ValueError, match=f"^{name} must be a finite number"):
            call()
        assert clock.now_ms() == 7 and clock.now_exact() == 7.0
    assert clock.advance(1.5) == 8


def test_manual_clock_says_which_kind_of_value_it_refused() -> None:
    with pytest.raises(ValueError, match=r"not NaN or an infinity$"):
        ManualClock(0).advance(float("nan"))
    with pytest.raises(ValueError, match=r"not NaN or an infinity$"):
        ManualClock(10**400)
    with pytest.raises(ValueError, match=r"not str$"):
        ManualClock(0).set("9")
