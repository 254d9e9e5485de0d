"""Defect (found by a review, SQLite and PostgreSQL): an exception raised by a supervision callback
(``on_lost``, ``on_lapse``, plain or async) was logged with ``log.exception``: the whole traceback,
every message verbatim, and the exception itself handed to the handlers (``exc_info``), so a
``--password`` or a URL password in the hook's error reached the log.

Now the callback's traceback is logged as the worker logs a failed run's: redacted (the store's
redaction, then the default rules), as text, with no ``exc_info``, naming the run.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from fencepost.clock import ManualClock
from fencepost.runstore.ownership import LeaseLost, Supervisor, supervise
from tests.runstore.conftest import A, activate_new
from tests.runstore.test_supervise_async import _steal

SECRETS = ("hunter2CB", "hunter2URL")
MESSAGE = "cleanup failed: tool --monkey --password hunter2CB postgres://app:hunter2URL@db/x"


def _assert_redacted(records: list[logging.LogRecord]) -> str:
    failed = [r for r in records if "supervision callback failed" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in records]
    record = failed[0]
    text = logging.Formatter("%(levelname)s %(message)s").format(record)
    for secret in SECRETS:
        assert secret not in text and secret not in repr(record.args) and secret not in str(record.msg)
    assert record.exc_info is None and record.levelno == logging.ERROR
    assert "RuntimeError" in text and "Traceback" in text and "--password [REDACTED]" in text
    assert record.getMessage().startswith("run r1: supervision callback failed")
    return text


def test_an_on_lost_hook_that_raises_is_logged_redacted(store, caplog):
    activate_new(store, "r1", A)
    owner_clock = ManualClock(0)
    sup = Supervisor(store, A, clock=owner_clock)
    called = threading.Event()

    def on_lost(lease: object) -> None:
        called.set()
        raise RuntimeError(MESSAGE)

    try:
        with caplog.at_level(logging.INFO, logger="fencepost.ownership"):
            sup.hold("r1", on_lost=on_lost)
            store.runs.transition_owned("r1", A, "completed")  # the next pulse answers FenceLost
            owner_clock.set(1000)
            assert called.wait(5)
            sup.settle(5)
    finally:
        sup.stop()
    _assert_redacted(caplog.records)


@pytest.mark.parametrize("kind", ["plain", "async"])
def test_an_on_lapse_hook_that_raises_is_logged_redacted(store, kind, caplog):
    activate_new(store, "r1", A)
    owner_clock = ManualClock(0)
    sup = Supervisor(store, A, clock=owner_clock)

    def plain(ms: int) -> None:
        raise RuntimeError(MESSAGE)

    async def coroutine(ms: int) -> None:
        raise RuntimeError(MESSAGE)

    async def main() -> str:
        try:
            async with supervise(store, "r1", A, on_lapse=plain if kind == "plain" else coroutine, supervisor=sup):
                _steal(store, "r1")
                owner_clock.set(19_000)
                while True:
                    await asyncio.sleep(0.005)
        except LeaseLost as exc:
            return exc.reason
        return "no LeaseLost"

    try:
        with caplog.at_level(logging.INFO, logger="fencepost.ownership"):
            assert asyncio.run(asyncio.wait_for(main(), 10)) == "lapsed"
    finally:
        sup.stop()
    _assert_redacted(caplog.records)
