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

    def sleeper() -> None:
        clock.sleep(1.0)
        woke.set()

    t = threading.Thread(target=sleeper)
    t.start()
    clock.advance(999)
    assert not woke.wait(0.05)
    clock.advance(1)
    assert woke.wait(2)
    t.join()


def test_system_clock_reads_integer_milliseconds() -> None:
    now = SystemClock().now_ms()
    assert type(now) is int and now > 1_700_000_000_000
