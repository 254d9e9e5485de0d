"""A store the console waits for keeps being retried whatever ends an open attempt, on both backends.

An attempt that ends by a ``BaseException`` (``KeyboardInterrupt``, ``SystemExit``, a task's
``CancelledError``) used to leave the attempt recorded as in flight, so no later request ever
started another and the store stayed down for good; and a start-up check that failed by an
unexpected exception (not the check's own refusal) refused the store for good, its message shown
on every page. Now the attempt is always cleared and what it opened closed; an unexpected failure
is logged by its type alone and the store is tried again. The checks' own refusals (the same
database given twice, a partial shard set) still refuse: ``tests/ui/test_late_store.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

import fencepost
from fencepost.errors import OpenError
from fencepost.ui import awaited


def _awaited(url: str) -> awaited.AwaitedStore:
    """``url``'s store as the console holds one whose database did not answer at start-up."""
    fencepost.open(url).close()  # created and migrated: the attempts find it answering
    error = OpenError("cannot_connect", "open", "the database did not answer")
    error.transient = True
    return awaited.AwaitedStore(url, error)


def _opened_within(store: awaited.AwaitedStore, timeout: float) -> bool:
    """Ask for the store as requests do until it opened (each ask may start an attempt)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            store.feed  # noqa: B018 - an access, as a request makes
            return True
        except OpenError:
            time.sleep(0.05)
    return False


def _failing_once(exc: BaseException) -> tuple[Any, list[Any]]:
    """A start-up check that raises ``exc`` the first time, then passes; and the stores it saw."""
    seen: list[Any] = []

    def check(opened: Any) -> None:
        seen.append(opened)
        if len(seen) == 1:
            raise exc
    return check, seen


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3), asyncio.CancelledError()],
                         ids=["KeyboardInterrupt", "SystemExit", "CancelledError"])
def test_an_attempt_ended_by_a_base_exception_is_cleared_and_retried(
        db_url: str, exc: BaseException, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(awaited, "RETRY_S", 0.0)
    monkeypatch.setattr("threading.excepthook", lambda args: None)  # the attempt's thread may end by it
    store = _awaited(db_url)
    check, seen = _failing_once(exc)
    store.checks.append(check)
    try:
        assert _opened_within(store, 20), f"never retried after {type(exc).__name__} ended an attempt"
        assert store.refused is None
        assert len(seen) == 2 and seen[0] is not seen[1]
        assert seen[0].db.engine.pool.checkedout() == 0  # the first attempt's store was closed
    finally:
        store.close()


@pytest.mark.parametrize("exc", [RuntimeError("boom at postgresql://u:hunter2@db/x"), KeyError("x"),
                                 OSError(24, "Too many open files")], ids=["RuntimeError", "KeyError", "OSError"])
def test_an_unexpected_failure_of_a_check_is_retried_not_refused(
        db_url: str, exc: Exception, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(awaited, "RETRY_S", 0.0)
    store = _awaited(db_url)
    check, seen = _failing_once(exc)
    store.checks.append(check)
    try:
        with caplog.at_level(logging.WARNING, logger="fencepost.ui"):
            assert _opened_within(store, 20), f"{type(exc).__name__} in a check refused the store for good"
        assert store.refused is None
        assert len(seen) == 2
    finally:
        store.close()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert type(exc).__name__ in logged, logged
    assert "hunter2" not in logged and "boom" not in logged, logged


def test_a_check_that_refuses_still_refuses(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A check's refusal (``StoreRefused`` from ``check_as_they_open``) is for good: never tried again."""
    monkeypatch.setattr(awaited, "RETRY_S", 0.0)
    store = _awaited(db_url)
    seen: list[str] = []

    def refuse(facts: list[Any]) -> None:
        seen.append("checked")
        if all(f is not None for f in facts):
            raise ValueError("store #0 is the same database as store 'x': give each store once")

    awaited.check_as_they_open([store], lambda s: s.feed.position().source, refuse, refuses=(ValueError,))
    try:
        deadline = time.monotonic() + 20
        while store.refused is None and time.monotonic() < deadline:
            with pytest.raises(OpenError):
                store.feed  # noqa: B018
            time.sleep(0.05)
        assert store.refused == "store #0 is the same database as store 'x': give each store once"
        checked = len(seen)
        for _ in range(10):
            with pytest.raises(OpenError) as err:
                store.feed  # noqa: B018
            assert err.value.code == "refused"
            time.sleep(0.02)
        assert len(seen) == checked and store.opened is None
    finally:
        store.close()
