"""The long-running read commands ride out a PostgreSQL server that stops for a while, then comes back.

A private server (``initdb`` + ``pg_ctl``, never the shared one) is stopped under
``fencepost projection run --follow`` and ``fencepost feed tail --follow``, left down for a few
seconds, then started again. Both commands must keep running, follow what is written once the server
is back, say nothing that holds the URL's password, and stop with exit 0 on SIGTERM.

Defect: ``projection run --follow`` ended with exit 1 (``persistence_failed: Projection.status: ...
the connection to the server was lost``) as soon as the server went away, although its builder
thread was waiting the outage out: the status line the main thread reads every ``--interval``
raised instead of being skipped until the server answered.

PostgreSQL only: a SQLite source has no server to lose, and its readers are not stopped by the
faults a SQLite file meets (a full disk, a file made read-only), which the writer tests cover.
"""

from __future__ import annotations

import json
import time

import pytest

import fencepost
from tests.cli.test_followers import _start
from tests.cli.test_projection_follow_rebuilds import _Lines
from tests.faults.conftest import private_server  # noqa: F401 - fixture

pytestmark = pytest.mark.slow

PASSWORD = "pw-Xq7s3cret"  # the private server trusts every login; the password only rides in the URL


def test_projection_and_feed_followers_outlive_a_server_stop(private_server) -> None:  # noqa: F811
    url = private_server.url.replace("postgres@", f"postgres:{PASSWORD}@")
    with fencepost.open(url) as store:
        store.runs.create("before", "{}")
    projection = _start("--db", url, "projection", "run", "--follow", "--interval", "0.2")
    feed = _start("--db", url, "feed", "tail", "--follow", "--format", "jsonl")
    p_lines, f_lines, p_errs = _Lines(projection), _Lines(feed), _Lines(projection, "stderr")
    try:
        p_lines.wait_for(lambda line: "position" in line and "lag 0" in line)
        f_lines.wait_for(lambda line: '"before"' in line)
        private_server._run("pg_ctl", "-D", str(private_server.data), "-m", "fast", "-w", "stop")
        time.sleep(4)  # past a read's own retries (about 2.6 s): status lines and feed polls fail meanwhile
        # The retries' jittered waits add up to 4 s at worst: the server comes back only once a
        # status read has given up (a read still retrying would just succeed, and nothing say so).
        p_errs.wait_for(lambda line: "projection runs_by_status: status unavailable (" in line)
        assert projection.poll() is None, "projection run --follow ended while the server was down"
        assert feed.poll() is None, "feed tail --follow ended while the server was down"
        private_server.start()
        with fencepost.open(url) as store:
            store.runs.create("after", "{}")
            head = store.feed.position().revision
        f_lines.wait_for(lambda line: '"after"' in line)
        p_lines.wait_for(lambda line: f":{head}  lag 0" in line)
    finally:
        p_code, p_err = p_lines.stop(projection, p_errs)
        f_code, f_err = f_lines.stop(feed)
    assert (p_code, f_code) == (0, 0), (p_err, f_err)
    assert "projection runs_by_status: status unavailable (" in p_err \
        and "projection runs_by_status: status available again" in p_err
    for text in (p_err, f_err, *p_lines.lines, *f_lines.lines):
        assert PASSWORD not in text
        assert "Traceback" not in text
    assert [json.loads(line)["run_id"] for line in f_lines.lines] == ["before", "after"]

