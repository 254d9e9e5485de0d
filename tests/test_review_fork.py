"""Review: a store opened in a parent process stays correct when the process forks.

``Database`` keeps one connection per thread between transactions. After ``fork()`` those
connections are the parent's live sessions (on PostgreSQL, one socket shared by both processes):
the child must never close, reset or roll them back, or it silently undoes the parent's work.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

import fencepost
from fencepost.runstore import _sql as q
from tests.conftest import run_forked

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _insert(conn: Any, run_id: str) -> None:
    q.run(conn, q.INSERT_RUN, {"run_id": run_id, "state_json": "{}", "now": 0, "parent_run_id": None,
                               "lineage_id": None, "round_ordinal": None})


def test_fork_while_another_thread_holds_an_open_write_does_not_undo_that_write(store: fencepost.Store) -> None:
    """A fork in the middle of a thread's write transaction: the parent's commit still lands.

    Before the fix the child, while discarding the inherited per-thread connections, rolled the
    parent's open PostgreSQL transaction back over the shared socket; the parent then "committed"
    nothing and the run was silently lost.
    """
    inside, go = threading.Event(), threading.Event()

    def body(conn: Any) -> None:
        _insert(conn, "written-across-fork")
        inside.set()
        assert go.wait(30)

    writer = threading.Thread(target=lambda: store.db.write(body))
    writer.start()
    assert inside.wait(30)
    try:
        assert run_forked(lambda: None) == 0
    finally:
        go.set()
        writer.join(30)
    assert store.runs.get("written-across-fork").status == "pending"


def test_a_forked_child_can_use_and_close_the_store_while_the_parent_keeps_writing(
        store: fencepost.Store) -> None:
    """The child writes through the inherited store and closes it; the parent's sessions survive."""
    store.runs.create("before-fork", "{}")
    # A finished thread leaves its connection in the pool; the main thread keeps its own.
    t = threading.Thread(target=lambda: store.runs.create("from-a-thread", "{}"))
    t.start()
    t.join()

    def child() -> None:
        store.runs.create("from-the-child", "{}")
        store.close()

    assert run_forked(child) == 0
    store.runs.create("after-fork", "{}")
    t = threading.Thread(target=lambda: store.runs.create("after-fork-thread", "{}"))
    t.start()
    t.join()
    for rid in ("before-fork", "from-a-thread", "from-the-child", "after-fork", "after-fork-thread"):
        assert store.runs.get(rid).status == "pending"


def test_a_child_forked_inside_a_write_does_not_join_the_parents_transaction(store: fencepost.Store) -> None:
    """A process forked from inside a ``write`` callback (multiprocessing with fork) uses its own
    connection: before the fix its store calls joined the parent's open transaction over the
    parent's connection (seeing its uncommitted rows, and on PostgreSQL talking on its session)."""
    store.runs.create("committed-before", "{}")

    def child() -> None:
        assert not store.db.in_write()
        assert store.runs.get("committed-before").status == "pending"
        assert store.runs.lineage("parent-in-write") == []  # uncommitted in the parent: invisible here

    def body(conn: Any) -> None:
        _insert(conn, "parent-in-write")
        assert run_forked(child) == 0

    store.db.write(body)
    assert store.runs.get("parent-in-write").status == "pending"
