"""Journal fixtures: owners and a lease helper (the journal's fence reads ``flows_consensus_leases``)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

import fencepost
from fencepost.journal import OwnerId

A = OwnerId("host-a", 101, "owner-a")
B = OwnerId("host-b", 202, "owner-b")


def hold(store: fencepost.Store, run_id: str, owner: OwnerId, at_ms: int = 0) -> None:
    """Make ``owner`` the lease holder of ``run_id`` (claim cleared), as the consensus would."""

    def body(conn) -> None:
        conn.execute(text("DELETE FROM flows_consensus_leases WHERE run_id = :r"), {"r": run_id})
        conn.execute(
            text(
                "INSERT INTO flows_consensus_leases (run_id, owner_host_id, owner_pid, owner_nonce, granted_at_ms,"
                " heartbeat_at_ms) VALUES (:r, :h, :p, :n, :t, :t)"
            ),
            {"r": run_id, "h": owner.host_id, "p": owner.pid, "n": owner.nonce, "t": at_ms},
        )

    store.db.write(body)


def release(store: fencepost.Store, run_id: str) -> None:
    """Drop the lease of ``run_id`` (released, settled or suspended: nobody holds it)."""
    store.db.write(lambda conn: conn.execute(text("DELETE FROM flows_consensus_leases WHERE run_id = :r"),
                                             {"r": run_id}))


def rows(store: fencepost.Store, run_id: str | None = None) -> list[tuple]:
    """Every stored journal row (run_id, seq, source_id, source_seq, payload_json), in position order."""
    sql = "SELECT run_id, seq, source_id, source_seq, payload_json, position FROM flows_journal_events"
    params = {}
    if run_id is not None:
        sql += " WHERE run_id = :r"
        params["r"] = run_id
    sql += " ORDER BY position"
    return store.db.read(lambda conn: [tuple(r) for r in conn.execute(text(sql), params)])


def writer_process(url: str, index: int, rounds: int, step, barrier, out) -> None:
    """A writer process of a race (module-level, so a spawned child can run it): open the store at
    ``url``, pass ``barrier`` with the others, call ``step(journal, index, k)`` for ``k`` in
    ``range(rounds)``; put ``("ok", index)`` on ``out``, or ``("error", what)`` if anything raised."""
    try:
        with fencepost.open(url) as store:
            j = store.journal
            barrier.wait(60)
            for k in range(rounds):
                step(j, index, k)
        out.put(("ok", index))
    except BaseException as exc:  # report to the parent instead of dying silently
        out.put(("error", f"{type(exc).__name__}: {exc}"[:300]))


@pytest.fixture
def journal(store: fencepost.Store):
    return store.journal
