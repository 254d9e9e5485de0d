"""Review: ``Database.after_commit`` callbacks of a rolled-back savepoint never run.

A nested ``write`` is a savepoint; when it raises, its writes are undone while the outer
transaction goes on and commits. A callback it registered (the run store's
``flows_run_throughput`` +1 for a terminal transition) must be dropped with it.
"""

from __future__ import annotations

from typing import Any

import pytest

import fencepost
from fencepost import OwnerId, RunSnapshot, Transitioned
from fencepost.runstore import store as runstore_module

A = OwnerId("host-a", 1, "a")


class _Boom(Exception):
    pass


def test_after_commit_of_a_rolled_back_savepoint_does_not_run(store: fencepost.Store) -> None:
    fired: list[str] = []

    def inner(conn: Any) -> None:
        store.db.after_commit(lambda: fired.append("inner"))
        raise _Boom

    def outer(conn: Any) -> None:
        store.db.after_commit(lambda: fired.append("outer-before"))
        with pytest.raises(_Boom):
            store.db.write(inner)
        store.db.after_commit(lambda: fired.append("outer-after"))

    store.db.write(outer)
    assert fired == ["outer-before", "outer-after"]


def test_a_terminal_transition_undone_by_its_savepoint_is_not_counted_as_throughput(
        store: fencepost.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    counted: list[int] = []
    monkeypatch.setattr(runstore_module, "_count_throughput", lambda: counted.append(1))
    store.runs.create("r", "{}")
    store.runs.claim_and_own("r", RunSnapshot("pending", None, None), A, 0)

    def inner(conn: Any) -> None:
        assert store.runs.transition_owned("r", A, "completed") == Transitioned()
        raise _Boom

    def outer(conn: Any) -> None:
        with pytest.raises(_Boom):
            store.db.write(inner)

    store.db.write(outer)
    assert store.runs.get("r").status == "running" and counted == []
    assert store.runs.transition_owned("r", A, "completed") == Transitioned()
    assert counted == [1]
