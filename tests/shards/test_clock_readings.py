"""A shard membership stamp from a clock reading that is no non-negative safe integer is refused by name.

Defect: founding or joining a shard set stamped ``joined_at_ms`` and ``founded_at_ms`` with the
store clock's reading unchecked; since the columns bound the stamp to ``0 ..= 2**53 - 1``, a clock
of one's own reading fractional, negative, too large or no ``int`` failed with ``constraint ...
shard membership persistence failed``, naming neither the clock nor the rule. Opening a set now
refuses such a reading as the run store does (``clock reading must be a non-negative safe
integer``), code ``invalid_shards``, and writes no record. Both backends.
"""

from __future__ import annotations

from typing import Any

import pytest

import fencepost
from fencepost._durable import Database
from fencepost.shards import ShardError
from tests.conftest import store_exists

BAD = [1_000.5, -5, 2**53, float("nan"), "1000", None]


class TurningClock:
    """Reads 1000 for the first ``good`` readings, then ``bad``."""

    def __init__(self, good: int, bad: Any) -> None:
        self.good, self.bad, self.readings = good, bad, 0

    def now_ms(self) -> Any:
        self.readings += 1
        return 1_000 if self.readings <= self.good else self.bad

    def sleep(self, seconds: float) -> None:  # pragma: no cover - never waits here
        pass


def _records(url: str) -> list[tuple]:
    db = Database(url, readonly=True)
    try:
        return db.read(lambda conn: [tuple(r) for r in conn.exec_driver_sql(
            "SELECT shard_name, joined_at_ms, founded_at_ms FROM flows_shard_membership")])
    finally:
        db.dispose()


def _refused(urls: list[str], clock: Any) -> ShardError:
    with pytest.raises(ShardError) as err:
        fencepost.open_shards(urls, clock=clock)
    assert err.value.code == "invalid_shards", err.value
    assert "clock reading must be a non-negative safe integer" in str(err.value)
    assert err.value.cause == {"field": "clock"}  # type: ignore[attr-defined]
    return err.value


@pytest.mark.parametrize("reading", BAD, ids=repr)
def test_a_bad_clock_is_refused_before_any_store_is_created(shard_urls, reading):
    urls = shard_urls(2)
    _refused(urls, TurningClock(0, reading))
    assert not any(store_exists(u) for u in urls)


@pytest.mark.parametrize("reading", BAD, ids=repr)
def test_a_clock_turning_bad_before_the_joining_stamp_writes_no_record(shard_urls, reading):
    urls = shard_urls(2)
    _refused(urls, TurningClock(1, reading))  # good for the check before creating, bad for joined_at_ms
    assert [_records(u) for u in urls] == [[], []]
    with fencepost.open_shards(urls, clock=TurningClock(10, None)):  # the founding is done by a good clock
        pass
    assert [_records(u) for u in urls] == [[("shard-0", 1_000, 1_000)], [("shard-1", 1_000, 1_000)]]


@pytest.mark.parametrize("reading", BAD, ids=repr)
def test_a_clock_turning_bad_before_the_founded_stamp_leaves_the_store_unrecorded(shard_urls, reading):
    """Store #0's record and founded mark are written in one transaction (the one that decides the
    founding): a mark refused takes the record back with it, so the refused open leaves the store
    as it was, and a good clock then founds the set."""
    urls = shard_urls(1)
    _refused(urls, TurningClock(2, reading))  # check, joined_at_ms, then founded_at_ms is bad
    assert _records(urls[0]) == []
    with fencepost.open_shards(urls, clock=TurningClock(10, None)):
        pass
    assert _records(urls[0]) == [("shard-0", 1_000, 1_000)]
