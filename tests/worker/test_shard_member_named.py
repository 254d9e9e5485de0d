"""A worker over a shard set names the member whose database failed.

Defect (found by a shard-set hunt): when one member of a shard set stopped answering, the worker
logged ``worker: database unavailable (42P01)`` with no word of which member, and a worker ended by
a member's SQLite file being replaced raised ``file_replaced ... open the store again`` with
``store=None``: with several files nobody could tell which one to look at. The sweep's reads now name
the member (``store`` on the error, and in the log line).
"""

from __future__ import annotations

import logging
import os
import threading

import pytest
from sqlalchemy import create_engine

import fencepost
from fencepost.clock import ManualClock
from fencepost.errors import RunStoreError
from fencepost.worker import Worker
from tests.conftest import require_postgres
from tests.worker.conftest import run_in_thread, stop_worker, wait_for


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_worker_ended_by_a_replaced_member_file_names_the_member(make_db_url):
    urls = [make_db_url() for _ in range(2)]
    with fencepost.open_shards(urls, clock=ManualClock(0)) as shards:
        worker = Worker(shards, lambda ctx: None)
        other = make_db_url()
        fencepost.open(other).close()
        path = urls[1][len("sqlite:///"):]
        for suffix in ("-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        os.replace(other[len("sqlite:///"):], path)
        with pytest.raises(RunStoreError) as err:
            worker.run(threading.Event())
    assert err.value.store == "shard-1" and "replaced" in str(err.value)


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_worker_waiting_out_a_member_names_it_in_its_warning(make_db_url, caplog):
    urls = [make_db_url() for _ in range(2)]
    schema = urls[1].rsplit("schema=", 1)[1]
    engine = create_engine(require_postgres())

    def rename(old: str, new: str) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'ALTER SCHEMA "{old}" RENAME TO "{new}"')

    caplog.set_level(logging.WARNING, logger="fencepost.worker")
    try:
        with fencepost.open_shards(urls) as shards:
            stop = threading.Event()
            thread, outcome = run_in_thread(Worker(shards, lambda ctx: None), stop)
            rename(schema, schema + "_away")
            try:
                assert wait_for(lambda: any("database unavailable" in r.getMessage() for r in caplog.records), 15)
            finally:
                rename(schema + "_away", schema)
            assert wait_for(lambda: any("available again" in r.getMessage() for r in caplog.records), 15)
            stop_worker(thread, stop, outcome, 20)
        [warning] = [r.getMessage() for r in caplog.records if "database unavailable" in r.getMessage()]
        assert "shard shard-1" in warning, warning
    finally:
        engine.dispose()
