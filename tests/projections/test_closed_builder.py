"""A closed ProjectionBuilder refuses every call with ``projection_failed`` ('the builder is closed')
and opens nothing on its target again.

Before: ``catch_up``, ``rebuild``, ``offer`` and ``run`` refused after ``close()``, but ``status()``
and ``rebuilds()`` went on working by opening a new connection to the target that nothing closed
any more (one PostgreSQL session or SQLite file handle left behind per closed builder, until the
process exited). Every target placement, both backends.
"""

from __future__ import annotations

import threading

import pytest

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus


def _connections(builder: ProjectionBuilder) -> int:
    pool = builder.target.engine.pool
    return pool.checkedin() + pool.checkedout()


@pytest.mark.parametrize("call", ["status", "rebuilds", "catch_up", "rebuild", "offer", "run"])
def test_a_closed_builder_refuses_every_call_and_opens_no_connection(store, target_url, call):
    store.runs.create("r", "{}")
    builder = ProjectionBuilder(store, target_url, RunsByStatus())
    builder.catch_up()
    owned = target_url != store.url
    builder.close()
    before = _connections(builder)
    calls = {
        "status": builder.status,
        "rebuilds": builder.rebuilds,
        "catch_up": builder.catch_up,
        "rebuild": builder.rebuild,
        "offer": lambda: builder.offer(store.feed.read(["r"])),
        "run": lambda: builder.run(threading.Event()),
    }
    with pytest.raises(ProjectionError) as caught:
        calls[call]()
    assert caught.value.code == "projection_failed" and "the builder is closed" in str(caught.value)
    if owned:  # the builder's own target: closed, and it stays closed
        assert before == 0 and _connections(builder) == 0
    builder.close()  # closing again is harmless
