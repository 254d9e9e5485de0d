"""The live event stream: one change-feed follower per console, a write on the stream within a second."""

from __future__ import annotations

import time

from fencepost.ui import views

from .conftest import PENDING, TESTER, EventStream, new_run


def test_a_write_appears_on_the_stream_within_one_second(console, writer, events):
    for _ in range(3):
        rid = new_run(writer, "ui-sse")
        written = time.monotonic()
        _, data, arrived = events.wait(lambda n, d, rid=rid: n == "run" and d["run_id"] == rid, timeout=1.0)
        assert arrived - written < 1.0
        assert data["status"] == "pending" and data["flow_name"] == "ui-test" and not data["deleted"]
        writer.runs.claim_and_own(rid, PENDING, TESTER, writer.clock.now_ms())
        written = time.monotonic()
        _, data, arrived = events.wait(
            lambda n, d, rid=rid: n == "run" and d["run_id"] == rid and d["status"] == "running", timeout=1.0)
        assert arrived - written < 1.0
        assert data["owner"] == "ui-test-host/4242/nonce-ui"
        assert "apiKey" not in str(data) and "SECRET" not in str(data)


def test_every_open_page_shares_the_one_follower(console, writer):
    hub = console.app.state.hub
    _settle(hub, 0)  # an earlier test's stream may still be closing
    base = hub.subscribers
    streams = [EventStream(console.url) for _ in range(4)]
    try:
        assert hub.subscribers == base + 4
        rid = new_run(writer, "ui-fan")
        for s in streams:
            s.wait(lambda n, d: n == "run" and d["run_id"] == rid, timeout=2.0)
        assert hub.followers_started == 1
    finally:
        for s in streams:
            s.close()
    _settle(hub, base)
    assert hub.subscribers == base  # a closed page leaves the hub


def _settle(hub, n: int) -> None:
    deadline = time.monotonic() + 5
    while hub.subscribers > n and time.monotonic() < deadline:
        time.sleep(0.05)


def test_stats_events_carry_counts_projection_lag_and_health(console, writer, events):
    new_run(writer, "ui-stats")
    written = writer.feed.position()
    expected_lag = written.revision - views.projections(writer)[0]["applied_revision"]
    assert expected_lag > 0  # the demo's projection builder has stopped: every later write is lag

    # The stream first sends the hub's last sample, which may predate the write: wait for one
    # whose counts were read at or after it (as_of), then it must show the run.
    def after_the_write(name, data):
        return name == "stats" and data["as_of"]["revision"] >= written.revision

    _, data, _ = events.wait(after_the_write, timeout=3.0)
    assert data["as_of"]["source"] == written.source
    counts = views.status_counts(writer)
    assert sum(data["counts"].values()) <= sum(counts.values()) and data["counts"]["pending"] >= 1
    assert data["projections"][0]["lag"] >= expected_lag
    assert data["health"]["source"] == writer.feed.position().source
    assert data["health"]["run_writes_per_s"] is not None
