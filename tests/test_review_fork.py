"""Review: a store opened in a parent process stays correct when the process forks.

``Database`` keeps one connection per thread between transactions. After ``fork()`` those
connections are the parent's live sessions (on PostgreSQL, one socket shared by both processes):
the child must never close, reset or roll them back, or it silently undoes the parent's work.
"""

from __future__ import annotations

import os
import signal
import threading
import traceback
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


WINDOW = 0.3  # seconds the first thread to reset waits inside the reset for a second one to come in


def _overlaps(obj: Any, name: str) -> tuple[threading.Event, list[int]]:
    """Wrap ``obj.name`` (a reset a forked child makes once) so that the first thread in it waits
    up to ``WINDOW`` for another to come in too; returns (first thread inside, [most at once])."""
    original = getattr(obj, name)
    entered, second = threading.Event(), threading.Event()
    guard = threading.Lock()
    inside, most = [0], [0]

    def hooked(*args: Any, **kwargs: Any) -> Any:
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            first = not entered.is_set()
            entered.set()
        try:
            if first:
                second.wait(WINDOW)  # room for another thread to reset too (it must not)
            else:
                second.set()
            return original(*args, **kwargs)
        finally:
            with guard:
                inside[0] -= 1

    setattr(obj, name, hooked)
    return entered, most


# The checkpoint thread is SQLite's alone: a PostgreSQL store has none to reset.
@pytest.mark.parametrize(("part", "backend"), [
    ("connections", "sqlite"), ("connections", "postgresql"), ("group_commit", "sqlite"),
    ("group_commit", "postgresql"), ("checkpointer", "sqlite"),
], indirect=["backend"])
def test_two_threads_making_their_first_call_in_a_forked_child_reset_its_state_once(
        store: fencepost.Store, part: str) -> None:
    """In a forked child, the first call of each thread reset the store's per-process state (its
    threads' connections and locks, the group-commit queue and lock, the SQLite checkpoint thread)
    with no lock: two threads starting together could both reset it, one losing the connection it
    had just kept or entering a lock the other had just replaced. Now one thread resets it, once,
    and the other waits for it. (Each reset is held open for a moment so the second thread
    arrives while the first is inside; three forks.)"""
    db = store.db
    assert part != "checkpointer" or db.backend.checkpointer is not None
    store.runs.create("before-fork", "{}")
    target = {"connections": (db.engine, "dispose"), "group_commit": (db._group, "_reset"),
              "checkpointer": (getattr(db.backend, "checkpointer", None), "_reset")}[part]

    def child(round_: int) -> None:
        signal.alarm(20)  # a thread stuck on a lock ends the child
        entered, most = _overlaps(*target)
        results: dict[str, object] = {}
        done = {"first": threading.Event(), "second": threading.Event()}
        hold = threading.Event()  # the threads stay alive, keeping their connections, until checked

        def call(name: str) -> None:
            try:
                if part == "connections":
                    results[name] = store.runs.get("before-fork").run_id
                else:
                    store.runs.create(f"{name}-{round_}", "{}")
                    results[name] = store.runs.get(f"{name}-{round_}").run_id
            except Exception as exc:  # examined below
                results[name] = repr(exc)
            done[name].set()
            hold.wait(15)

        first = threading.Thread(target=call, args=("first",))
        second = threading.Thread(target=call, args=("second",))
        first.start()
        assert entered.wait(10)
        second.start()
        try:
            assert all(e.wait(15) for e in done.values())
            # Both threads keep their connections (none lost to a second reset): a read
            # connection each, and for writes a write connection too (or one for the group).
            kept = len(db._slots)
        finally:
            hold.set()
            first.join(15)
            second.join(15)
        assert most[0] == 1, f"{most[0]} threads reset the child's {part} at once"
        expected = "before-fork" if part == "connections" else None
        assert results == {n: expected or f"{n}-{round_}" for n in ("first", "second")}, results
        assert db._connecting == 0 and not db._releasing
        assert kept >= 2, kept

    for round_ in range(3):
        def run_child(r: int = round_) -> None:
            try:
                child(r)
            except BaseException:
                traceback.print_exc()  # shown with the test's failure
                raise
        assert run_forked(run_child) == 0, f"round {round_}"
    store.runs.create("after-fork", "{}")
    assert store.runs.get("before-fork").run_id == "before-fork"
