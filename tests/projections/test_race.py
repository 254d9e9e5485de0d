"""Two builders with one name racing on one target: the lock serializes them, and even without it
the checkpoint compare-and-swap keeps any change from being applied twice."""

from __future__ import annotations

import random
import threading

import pytest
from sqlalchemy import text

from fencepost._migrations import migrate
from fencepost.projections import ProjectionBuilder
from tests.projections import _runs
from tests.projections._counting import CountingRunsByStatus, log_metadata


def _duplicates(builder: ProjectionBuilder) -> list:
    return builder.target.read(lambda conn: conn.execute(text(
        "SELECT run_id, source, revision FROM test_projection_applications "
        "GROUP BY run_id, source, revision HAVING COUNT(*) > 1")).all())


@pytest.mark.parametrize("locked", [True, False], ids=["with-lock", "lock-bypassed"])
def test_two_builders_with_one_name_never_apply_a_change_twice(store, target_url, locked):
    ids: list[str] = []
    rng = random.Random(3)
    store.db.write(lambda conn: [_runs.random_mutation(conn, rng, ids, "s", i) for i in range(150)])
    builders = [ProjectionBuilder(store, target_url, CountingRunsByStatus(), batch_size=5, lock_timeout=None)
                for _ in range(2)]
    migrate(builders[0].target, ("projections",))
    log_metadata.create_all(builders[0].target.engine)
    if not locked:
        for builder in builders:
            builder._lock.acquire = lambda timeout: None  # simulate a lock lost to a server restart
    barrier = threading.Barrier(3)
    stop = threading.Event()
    errors: list[BaseException] = []

    def follow(builder: ProjectionBuilder) -> None:
        try:
            barrier.wait()
            while not stop.is_set():
                builder.catch_up()
                if locked:
                    builder._lock.release()  # hand the name over so both really take turns
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=follow, args=(b,)) for b in builders]
    for thread in threads:
        thread.start()
    barrier.wait()
    for t in range(120):
        store.db.write(lambda conn, t=t: _runs.random_mutation(conn, rng, ids, "w", 1000 + t))
        if t == 60:
            store.feed.rotate_source()
    stop.set()
    for thread in threads:
        thread.join(60)
    assert errors == []
    try:
        builders[0].catch_up()
        assert _duplicates(builders[0]) == []
        assert builders[0].target.read(_runs.projected_rows_fn("test_counting_runs")) == store.db.read(
            _runs.live_rows)
        status = builders[0].status()
        applied = builders[0].target.read(lambda conn: conn.execute(
            text("SELECT COUNT(*) FROM test_projection_applications")).scalar())
        assert applied == status.applied and status.lag == 0
    finally:
        for builder in builders:
            builder.close()
