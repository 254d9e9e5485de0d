"""OpenTelemetry gauges (projection lag, feed position, worker in-flight), read with the SDK's
in-memory reader, on both backends."""

from __future__ import annotations

import threading

import pytest

from fencepost.projections import ProjectionBuilder, RunsByStatus
from fencepost.worker import Worker
from tests.runstore.test_metrics import value


def _points(otel, name):
    data = otel["reader"].get_metrics_data()
    out = []
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    out += [(dict(dp.attributes), dp.value) for dp in m.data.data_points]
    return out


def test_projection_lag_is_what_the_builder_has_not_applied(otel, store, db_url):
    for i in range(7):
        store.runs.create(f"p{i}", "{}")
    builder = ProjectionBuilder(store, db_url, RunsByStatus(), batch_size=3)
    try:
        builder.catch_up()
        assert value(otel, "flows_projection_lag", projection=builder.name) == 0
        for i in range(4):
            store.runs.create(f"q{i}", "{}")
        # Lag is read as of the builder's last page: still 0 until it looks again.
        assert value(otel, "flows_projection_lag", projection=builder.name) == 0
        builder.catch_up()
        assert value(otel, "flows_projection_lag", projection=builder.name) == 0
        assert builder.status().lag == 0
    finally:
        builder.close()
    assert not [p for p in _points(otel, "flows_projection_lag") if p[0].get("projection") == builder.name]


def test_projection_lag_reports_the_backlog_between_pages(otel, store, db_url):
    for i in range(10):
        store.runs.create(f"b{i}", "{}")
    builder = ProjectionBuilder(store, db_url, RunsByStatus(), batch_size=4)
    seen: list[int] = []
    builder._after_page = lambda shadow, page: seen.append(
        int(value(otel, "flows_projection_lag", projection=builder.name)))
    try:
        builder.catch_up()
    finally:
        builder.close()
    # Pages of 4 over 10 changes leave 6, 2, then 0 behind. The hook runs as each page commits,
    # before the builder records that page's lag, so it reads the previous page's: absent (0), 6, 2.
    assert seen == [0, 6, 2]
    assert value(otel, "flows_projection_lag", projection=builder.name) == 0


def test_feed_position_follows_the_reader_and_goes_when_it_stops(otel, store):
    for i in range(5):
        store.runs.create(f"f{i}", "{}")
    stop = threading.Event()
    got = []
    for change in store.feed.follow(None, stop=stop, poll_interval=0.2):
        got.append(change)
        if len(got) == 5:
            points = [p for p in _points(otel, "flows_feed_position") if p[0]["source"] == change.source]
            assert len(points) == 1 and points[0][1] == 5
            stop.set()
    assert not [p for p in _points(otel, "flows_feed_position") if p[0]["source"] == got[0].source]


def test_worker_in_flight_counts_the_runs_it_is_running(otel, store):
    for i in range(3):
        store.runs.create(f"w{i}", "{}")
    started = threading.Barrier(4)
    release = threading.Event()
    readings: list[float] = []

    def fn(ctx):
        started.wait(timeout=20)
        release.wait(timeout=20)
        return {"ok": True}

    worker = Worker(store, fn, concurrency=3)
    attrs = {"host": worker.owner.host_id, "pid": worker.owner.pid, "worker": worker.owner.nonce[:8]}
    t = threading.Thread(target=worker.run, kwargs={"until_idle": True})
    t.start()
    try:
        started.wait(timeout=20)
        readings.append(value(otel, "flows_worker_in_flight", **attrs))
    finally:
        release.set()
        t.join(30)
    assert readings == [3]
    assert worker.stats.completed == 3
    assert not [p for p in _points(otel, "flows_worker_in_flight") if p[0] == attrs]


@pytest.mark.parametrize("name", ["flows_projection_lag", "flows_feed_position", "flows_worker_in_flight"])
def test_gauges_are_documented(name):
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs" / "concepts"
    assert any(name in p.read_text() for p in docs.glob("*.md"))
