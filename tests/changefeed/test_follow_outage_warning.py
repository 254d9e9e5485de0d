"""A follower whose reads keep failing says so at WARNING, and says when the database answers again.

Defect (found by a fault hunt): a follower retries failed reads with backoff and logged each retry
at INFO only, so a PostgreSQL schema dropped (or renamed away) under ``fencepost feed tail --follow``
looked like a quiet, healthy tail: nothing on stderr, for ever. Now, once its reads have failed for
10 seconds on end, the follower logs one WARNING naming the failure's code (never a value), keeps
retrying, and logs a WARNING when a read succeeds again. The fault is real: the store's schema is
renamed away and back. (SQLite readers in WAL mode never wait for writers, and a file deleted or
replaced under a follower ends it with ``SourceChanged``: there is no SQLite outage a follower
waits out that a test can bring about.)
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time

import pytest
from sqlalchemy import create_engine

import fencepost
from fencepost.changefeed import follow as follow_module
from tests.cli.conftest import fencepost_exe
from tests.conftest import require_postgres

pytestmark = pytest.mark.parametrize("backend", ["postgresql"])


def _rename(url: str, old: str, new: str) -> None:
    engine = create_engine(require_postgres())
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'ALTER SCHEMA "{old}" RENAME TO "{new}"')
    finally:
        engine.dispose()


def _wait(done, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    return done()


def test_a_follower_warns_once_its_reads_have_failed_for_a_while_and_when_they_answer_again(
        db_url, monkeypatch, caplog):
    monkeypatch.setattr(follow_module, "UNAVAILABLE_WARN_S", 0.5)
    schema = db_url.rsplit("schema=", 1)[1]
    store = fencepost.open(db_url)
    stop = threading.Event()
    seen: list[str] = []

    def follow() -> None:
        for change in store.feed.follow(stop=stop, poll_interval=0.2):
            seen.append(change.run_id)

    thread = threading.Thread(target=follow, daemon=True)
    try:
        store.runs.create("before", "{}")
        caplog.set_level(logging.INFO, logger="fencepost.changefeed")
        thread.start()
        assert _wait(lambda: seen == ["before"])
        _rename(db_url, schema, schema + "_away")
        try:
            assert _wait(lambda: any(r.levelno == logging.WARNING and "has not answered" in r.getMessage()
                                     for r in caplog.records))
            time.sleep(1.0)  # more failed reads: still one warning
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1, [r.getMessage() for r in warnings]
            assert "42P01" in warnings[0].getMessage() and schema not in warnings[0].getMessage()
        finally:
            _rename(db_url, schema + "_away", schema)
        assert _wait(lambda: any("answers again" in r.getMessage() for r in caplog.records))
        store.runs.create("after", "{}")
        assert _wait(lambda: seen == ["before", "after"])
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(10)
        store.close()


def test_feed_tail_follow_says_on_stderr_that_the_database_stopped_answering(db_url):
    schema = db_url.rsplit("schema=", 1)[1]
    with fencepost.open(db_url) as store:
        store.runs.create("before", "{}")
    proc = subprocess.Popen([fencepost_exe(), "--db", db_url, "feed", "tail", "--from", "0", "--follow"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "before" in proc.stdout.readline()
        _rename(db_url, schema, schema + "_away")
        try:
            time.sleep(follow_module.UNAVAILABLE_WARN_S + 6)
        finally:
            _rename(db_url, schema + "_away", schema)
        time.sleep(2)
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=20)
    assert "has not answered for" in err and "still retrying" in err, err
    assert "Traceback" not in err
