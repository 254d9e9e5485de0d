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
