"""HEAD /events: the stream's headers, an ended response, and no subscription to the hub."""

from __future__ import annotations

import time

import httpx


def test_head_events_answers_headers_at_once_and_subscribes_nothing(console):
    """Defect (found by a review, SQLite and PostgreSQL): ``HEAD /events`` subscribed to the hub and
    its response never ended (no length, no last chunk): a client waited until its own timeout and
    each open HEAD counted as a live page, fed every broadcast. Now a HEAD is answered at once with
    the stream's headers and an empty body, and nothing subscribes."""
    hub = console.app.state.hub
    deadline = time.monotonic() + 5
    while hub.subscribers > 0 and time.monotonic() < deadline:  # an earlier test's stream closing
        time.sleep(0.05)
    base = hub.subscribers
    with httpx.Client(timeout=httpx.Timeout(3.0)) as client:
        for _ in range(3):
            response = client.head(console.url + "/events")
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["x-accel-buffering"] == "no"
            assert response.content == b"" and response.headers["content-length"] == "0"  # ended for any client
        assert hub.subscribers == base
        bad = client.head(console.url + "/events", params={"since": "nonsense"})
        assert bad.status_code == 400  # checked as a GET is, before anything else
    assert hub.subscribers == base
