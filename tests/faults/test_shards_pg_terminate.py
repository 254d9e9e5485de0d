"""PostgreSQL: a shard's backend terminated (``pg_terminate_backend``) in the middle of a shard-set
operation: the membership write of a grow, and the create that places a run on its shard.

Covers the pair nothing else did: terminated backend x shard-set operation. The backend is ended
right after the operation's write statement ran, before its COMMIT: either the writer finds out on
its next statement and runs the transaction again on a new connection, or the COMMIT meets the dead
session and the caller is told (the outcome may not be known). Either way nothing half-written is
left (a store's membership record is the old one or the new one, a run exists once or not at all),
and the same call, or the same shard set, then completes.
"""

from __future__ import annotations

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine

import fencepost
from tests.faults.conftest import shard_records

pytestmark = pytest.mark.slow


class _Terminator:
    """Ends the backend that just ran a statement matching ``what`` in ``schema`` (once)."""

    def __init__(self, admin: fencepost.Store, schema: str, what: str) -> None:
        self.admin, self.schema, self.what, self.fired = admin, schema, what, 0

    def __call__(self, conn, cursor, statement, params, context, executemany) -> None:
        if self.fired or self.what not in statement:
            return
        if conn.exec_driver_sql("SELECT current_schema()").scalar() != self.schema:
            return
        self.fired = 1
        pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
        self.admin.db.read(lambda c: c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar())

    def __enter__(self) -> _Terminator:
        event.listen(Engine, "after_cursor_execute", self)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(Engine, "after_cursor_execute", self)


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_grow_whose_backend_is_terminated_mid_record_finishes(make_db_url) -> None:
    urls = [make_db_url() for _ in range(3)]
    ids = [f"run-{i}" for i in range(8)]
    with fencepost.open_shards(urls[:2]) as shards:
        for run_id in ids:
            shards.runs.create(run_id, "{}")
    before = shard_records(urls[:2])
    schema = urls[1].rsplit("schema=", 1)[1]
    with fencepost.open(urls[0]) as admin, _Terminator(admin, schema, "UPDATE flows_shard_membership") as fault:
        try:
            fencepost.open_shards(urls, grow=True).close()
            outcome: object = "grown"
        except fencepost.ShardError as exc:
            outcome = exc
    assert fault.fired, "the fault was never injected"
    s0, s1, _s2 = shard_records(urls)
    # The first store is written last, in the transaction that holds it while the others are
    # written: grown, or (the other write failed) as before.
    grown = (2, ("shard-0", "shard-1", "shard-2"))
    assert (s0.generation, s0.members) == grown if outcome == "grown" else s0 == before[0], (outcome, s0)
    # The terminated store holds the old record or the new one, never a mix.
    assert s1 == before[1] or (s1.generation, s1.members) == (2, ("shard-0", "shard-1", "shard-2")), s1
    if outcome != "grown":
        assert isinstance(outcome, fencepost.ShardError) and outcome.code == "persistence_failed", outcome
        with fencepost.open_shards(urls, grow=True):  # the same grow, again, finishes it
            pass
    with fencepost.open_shards(urls) as shards:
        assert shards.membership.generation == 2
        assert [shards.runs.get(r).status for r in ids] == ["pending"] * len(ids)
        shards.runs.create("after", "{}")
    assert {(r.generation, r.members) for r in shard_records(urls)} == {(2, ("shard-0", "shard-1", "shard-2"))}


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_placed_create_whose_backend_is_terminated_lands_once(make_db_url) -> None:
    urls = [make_db_url() for _ in range(2)]
    with fencepost.open_shards(urls) as shards, fencepost.open(urls[0]) as admin:
        run_id = next(f"run-{i}" for i in range(100) if shards.place(f"run-{i}") == "shard-1")
        schema = urls[1].rsplit("schema=", 1)[1]
        with _Terminator(admin, schema, "INSERT INTO flows_runs") as fault:
            try:
                shards.runs.create(run_id, "{}")
                outcome: object = "created"
            except fencepost.RunStoreError as exc:
                outcome = exc
        assert fault.fired, "the fault was never injected"
        held = [shards[name].db.read(lambda c: c.execute(text(
            "SELECT count(*) FROM flows_runs WHERE run_id = :r"), {"r": run_id}).scalar()) for name in shards]
        if outcome == "created":
            assert held == [0, 1]
        else:
            assert isinstance(outcome, fencepost.RunStoreError) and outcome.code == "persistence_failed", outcome
            assert held in ([0, 0], [0, 1]), held
            if held == [0, 0]:
                shards.runs.create(run_id, "{}")  # the same shard set, again
        assert shards.locate(run_id) == "shard-1"
        assert shards.runs.get(run_id).status == "pending"
        shards.runs.create("after", "{}")
