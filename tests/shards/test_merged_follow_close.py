"""Stopping a merged follow whose consumer fell behind returns at once and ends its threads.

Defect (found by a shard-set review): each shard's pump thread handed its changes to the consumer
through a bounded queue, and its last ``put`` (the end marker, or an error) blocked on the full queue
once the consumer had stopped reading. ``generator.close()`` or ``stop.set()`` then waited 5 s per
shard for threads that never ended (one ``fencepost-follow-<shard>`` thread per shard blocked for the
life of the process); ``feed tail --follow`` over 3 stores took 15 s to exit after SIGTERM. A pump now
gives up handing over anything once the follow is stopping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

import fencepost
from tests.worker.conftest import wait_for

SHARDS = 3
PER_SHARD = 1200  # more than the merged queue holds (1000): every pump ends up blocked on it


def _follow_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t not in before and t.name.startswith("fencepost-follow-") and t.is_alive()]


def _backlogged(shards: fencepost.ShardSet) -> None:
    for name in shards.names:
        shards[name].runs.create_many([(f"{name}-{i}", "{}") for i in range(PER_SHARD)])


@pytest.mark.parametrize("how", ["close", "stop"])
def test_stopping_a_follow_with_a_backlog_returns_promptly_and_ends_its_threads(
        shard_urls: Callable[[int], list[str]], how: str) -> None:
    with fencepost.open_shards(shard_urls(SHARDS)) as shards:
        _backlogged(shards)
        before = set(threading.enumerate())
        stop = threading.Event()
        follow = shards.follow(stop=stop, poll_interval=0.2)
        assert next(follow).change.run_id  # the follow is running; the consumer now falls behind
        assert {t.name for t in _follow_threads(before)} >= {f"fencepost-follow-{n}" for n in shards.names}
        time.sleep(1.5)  # the pumps fill the queue and block on it
        started = time.monotonic()
        if how == "close":
            follow.close()
        else:
            stop.set()
            assert list(follow) == []  # a set stop ends the follow at once, yielding nothing more
        took = time.monotonic() - started
        assert took < 3.0, f"stopping took {took:.1f} s"
        assert wait_for(lambda: not _follow_threads(before), 1.0), _follow_threads(before)
