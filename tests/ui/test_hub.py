"""The hub's subscriber queue: a stalled page is dropped with a reset, never grows without bound."""

from __future__ import annotations

import asyncio

from fencepost.ui.hub import QUEUE_LIMIT, Subscriber, sse


def test_a_stalled_subscriber_is_dropped_with_a_reset_after_the_limit():
    async def body() -> list[bytes | None]:
        sub = Subscriber(asyncio.get_running_loop())
        for i in range(QUEUE_LIMIT + 50):
            sub._offer(sse("run", {"n": i}))
        sub._offer(None)  # a later close changes nothing more
        out = []
        while not sub.queue.empty():
            item = sub.queue.get_nowait()
            out.append(None if item is None else item[0])
        return out

    frames = asyncio.run(body())
    assert len(frames) == QUEUE_LIMIT + 2
    assert frames[QUEUE_LIMIT - 1] == sse("run", {"n": QUEUE_LIMIT - 1})
    assert frames[-2].startswith(b"event: reset\n") and b"slow_consumer" in frames[-2]
    assert frames[-1] is None


def test_sse_frames_are_one_event_with_one_data_line():
    frame = sse("run", {"run_id": "a\nb", "x": "</script>"}, "7")
    assert frame == b'event: run\nid: 7\ndata: {"run_id":"a\\nb","x":"</script>"}\n\n'
    assert frame.count(b"\n\n") == 1


def test_stats_over_many_runs_are_taken_less_often_however_busy_the_store(store) -> None:
    """Found timing the console against a large store: its stats count runs by status, a read of
    the whole run table (15 ms on SQLite, 38 ms on PostgreSQL at 400,000 runs, growing with the
    table), and while anything moved the ticker took them every second. Stats that counted N runs
    are now not taken again before N / STATS_RUNS_PER_S seconds, however busy the store: here the
    stats report 1.2 million runs more than the store holds, the ticker ticks every 0.02 s and a
    writer keeps the store busy, so the next stats come 3 s later instead of at the next tick. A
    small store's stats still follow every tick (the other console tests)."""
    import threading
    import time

    from fencepost.ui import views
    from fencepost.ui.hub import STATS_RUNS_PER_S, FeedHub
    from tests.conftest import eventually

    taken: list[float] = []
    more = 3 * STATS_RUNS_PER_S

    def stats(hub: FeedHub) -> object:
        out = views.stats(hub.store, hub)
        out["counts"]["completed"] += more
        taken.append(time.monotonic())
        return out

    hub = FeedHub(store, stats=stats, poll_interval=0.05, tick=0.02, stats_every=0.0)
    busy = threading.Event()

    def writer() -> None:
        i = 0
        while not busy.is_set():
            store.runs.create(f"busy-{i}", "{}")
            i += 1
            time.sleep(0.05)

    hub.start()
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert eventually(lambda: len(taken) >= 2, timeout=10), taken
    finally:
        busy.set()
        thread.join()
        hub.close()
    assert taken[1] - taken[0] >= 2.9, taken
    assert hub.last_stats is not None and sum(hub.last_stats["counts"].values()) > more
