"""``catch_up`` and ``rebuild`` report the revision reached of the source's head through ``on_progress``.

Defect: a first build of a big source (or a rebuild) said nothing until the end, so ``fencepost
projection run`` and ``projection rebuild`` could draw no progress bar.
"""

from __future__ import annotations

import itertools

import pytest

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections import _runs


def _seed(store, n: int) -> None:
    def body(conn):
        for i in range(n):
            _runs.create(conn, f"r-{i}", i)

    store.db.write(body)


def _increasing(calls: list[tuple[int, int]]) -> bool:
    return all(a[0] <= b[0] for a, b in itertools.pairwise(calls)) and all(d <= t for d, t in calls)


def test_catch_up_reports_each_page_up_to_the_head(store, db_url) -> None:
    _seed(store, 23)
    head = store.feed.position().revision
    calls: list[tuple[int, int]] = []
    with ProjectionBuilder(store, db_url, RunsByStatus(), batch_size=5) as builder:
        result = builder.catch_up(on_progress=lambda done, total: calls.append((done, total)))
        assert calls[0] == (0, head) and calls[-1] == (head, head) == (result.revision, head)
        assert _increasing(calls) and len(calls) >= 23 // 5 + 1, calls
        calls.clear()
        builder.catch_up(on_progress=lambda done, total: calls.append((done, total)))
        assert calls == [(head, head), (head, head)]  # nothing new: already at the head


def test_rebuild_reports_from_zero_up_to_the_head(store, db_url) -> None:
    _seed(store, 12)
    head = store.feed.position().revision
    with ProjectionBuilder(store, db_url, RunsByStatus(), batch_size=5) as builder:
        builder.catch_up()
        calls: list[tuple[int, int]] = []
        result = builder.rebuild(on_progress=lambda done, total: calls.append((done, total)))
    assert result.rebuilt and calls[0] == (0, head) and calls[-1] == (head, head), calls
    assert _increasing(calls)


def test_an_on_progress_that_is_not_callable_is_refused(store, db_url) -> None:
    with ProjectionBuilder(store, db_url, RunsByStatus()) as builder:
        for call in (builder.catch_up, builder.rebuild):
            with pytest.raises(ProjectionError) as caught:
                call(on_progress=5)
            assert caught.value.code == "invalid_projection" and "on_progress" in str(caught.value)
