"""Updates ``offer()`` turns away are in ``status().rejected``, before the first build too.

Defect: offered before the projection's first page (its checkpoint has no source yet, so nothing
can be compared and every snapshot is turned away), ``offer()`` returned ``rejected=N`` but the
checkpoint's total stayed 0: ``status().rejected``, documented as every rejection since the
checkpoint was created, disagreed with what the calls had returned. Now they are counted like any
other rejected offer, and nothing is applied.
"""

from __future__ import annotations

from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections import _runs


def test_offers_before_the_first_build_are_counted_as_rejected(store, target_url):
    store.db.write(lambda conn: [_runs.create(conn, f"run-{i}", i) for i in range(3)])
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        offered = builder.offer(store.feed.read(["run-0", "run-1"]))
        assert (offered.applied, offered.rejected, offered.revision) == (0, 2, 0)
        status = builder.status()
        assert (status.source, status.applied, status.rejected) == (None, 0, 2)
        done = builder.catch_up()
        assert (done.applied, done.rejected) == (3, 0)
        assert builder.offer(store.feed.read(["run-0"])).rejected == 1  # stale now: counted as before
        status = builder.status()
        assert (status.applied, status.rejected, status.lag) == (3, 3, 0)
