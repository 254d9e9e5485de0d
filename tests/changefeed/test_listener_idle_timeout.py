"""A PostgreSQL follower's LISTEN connection sits idle by design (it waits for notifications): a
role's ``idle_session_timeout`` used to end it at every timeout, and the follower reconnected and
re-read the feed each time. The listener's session now turns the timeout off for itself alone, so
one connection serves the whole follow. PostgreSQL only (the setting is the server's)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from sqlalchemy import make_url

import fencepost
from tests.test_pg_session_settings import _server, role  # noqa: F401  (the fixture)

pytestmark = pytest.mark.usefixtures("role")


def _listener_pids(schema: str) -> set[int]:
    with psycopg.connect(autocommit=True, **_server()) as conn:  # type: ignore[arg-type]
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                            (f"fencepost-follow-{schema}"[:63],)).fetchall()
    return {r[0] for r in rows}


def test_the_listener_keeps_one_connection_under_an_idle_session_timeout(role) -> None:  # noqa: F811
    url = role(idle_session_timeout="300ms")
    schema = make_url(url).query["schema"]
    with fencepost.open(url) as store:
        store.runs.create("before", "{}")
        stop = threading.Event()
        seen: list[str] = []

        def consume() -> None:
            for change in store.feed.follow(stop=stop, poll_interval=60):
                seen.append(change.run_id)

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 20
            while not (seen and _listener_pids(schema)) and time.monotonic() < deadline:
                time.sleep(0.05)
            pids: set[int] = set()
            for _ in range(20):  # 2 s: more than six timeouts
                pids |= _listener_pids(schema)
                time.sleep(0.1)
            assert len(pids) == 1, f"the listener reconnected: {len(pids)} sessions in 2 s"
            store.runs.create("after", "{}")  # and it still wakes the follower
            deadline = time.monotonic() + 20
            while "after" not in seen and time.monotonic() < deadline:
                time.sleep(0.05)
            assert seen == ["before", "after"]
        finally:
            stop.set()
            thread.join(10)
