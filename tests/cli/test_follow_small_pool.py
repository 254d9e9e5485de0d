"""``projection run --follow`` on a store whose URL sets ``pool_size=1`` follows, as ``feed tail
--follow`` does.

Defect: the status it prints every interval first checked that the target answers by taking a
connection from the pool directly, past the store's own checkout (which takes back a connection an
idle thread keeps); the follower's thread kept the only one, so the command printed nothing for
30 s, ignored SIGTERM meanwhile, and then failed with SQLAlchemy's ``QueuePool limit ... reached``
text (on PostgreSQL; a SQLite store answered). Now the check checks out as every call does. Both
backends: the pool is the store's on either.
"""

from __future__ import annotations

import json
import signal

from tests.cli.test_followers import _start, _stop


def _with_pool_of_one(url: str) -> str:
    return url + ("&" if "?" in url else "?") + "pool_size=1"


def test_projection_run_follow_with_a_pool_of_one_prints_status_and_stops_on_sigterm(three_runs):
    proc = _start("--db", _with_pool_of_one(three_runs), "projection", "run", "--follow", "--interval", "0.2",
                  "--format", "jsonl")
    try:
        first = json.loads(proc.stdout.readline())
        second = json.loads(proc.stdout.readline())
    finally:
        returncode, _out, err = _stop(proc, signal.SIGTERM)
    assert returncode == 0, err
    assert first["lag"] == 0 and second["lag"] == 0, (first, second)
    assert "QueuePool" not in err and "Error" not in err, err
