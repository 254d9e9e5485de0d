"""Shared fixtures of the run-store suites (UPSTREAM-TESTS.md shared fixtures).

Owners: ``A=(host-a,101,owner-a)``, ``B=(host-a,202,owner-b)`` (same host as A),
``C=(host-b,303,owner-c)``. The store clock starts at 0 (``ManualClock``).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from fencepost import LivenessEvidence, OwnerId, RunSnapshot
from fencepost.journal import companion_stream

A = OwnerId("host-a", 101, "owner-a")
B = OwnerId("host-a", 202, "owner-b")
C = OwnerId("host-b", 303, "owner-c")
PENDING = RunSnapshot("pending", None, None)


def running(owner: OwnerId, hb: int) -> RunSnapshot:
    return RunSnapshot("running", owner, hb)


def ev(expected: OwnerId, claimant: OwnerId, now: int, kind: str | None = None) -> LivenessEvidence:
    """Evidence about ``expected`` for ``claimant`` at ``now`` (kind by host relation unless given)."""
    if kind is None:
        kind = "same-host-pid-dead" if expected.host_id == claimant.host_id else "cross-host-unreachable-stale"
    return LivenessEvidence(expected, now, kind)


def activate_new(store: Any, run_id: str, owner: OwnerId, now: int | None = None) -> None:
    """create(run_id, "{}"), claim with the pending snapshot at ``now`` (store clock by default), activate."""
    t = store.clock.now_ms() if now is None else now
    store.runs.create(run_id, "{}")
    claimed = store.runs.claim(run_id, PENDING, owner, t)
    assert claimed.__class__.__name__ == "Claimed", claimed
    assert store.runs.activate(run_id, owner, claimed.claimed_at_ms, PENDING).__class__.__name__ == "Activated"


def facts(store: Any, run_id: str) -> list[tuple[str, dict[str, Any], Any]]:
    """``(type suffix, owner, grantedAtMs)`` of the run's companion-stream facts, in order."""
    with store.db.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT event_type, payload_json, meta_json FROM flows_journal_events WHERE run_id = "
            + ("?" if store.db.name == "sqlite" else "%(r)s") + " ORDER BY seq",
            (companion_stream(run_id),) if store.db.name == "sqlite" else {"r": companion_stream(run_id)},
        ).fetchall()
    out = []
    for etype, payload, meta in rows:
        p = msgspec.json.decode(payload)
        assert p["runId"] == run_id and msgspec.json.decode(meta) == {"runId": run_id}
        o = p["owner"]
        out.append((etype.removeprefix("flows.consensus."), OwnerId(o["hostId"], o["pid"], o["nonce"]),
                    p["grantedAtMs"]))
    return out


def revision(store: Any) -> int:
    with store.db.connect() as conn:
        return int(conn.exec_driver_sql("SELECT revision FROM flows_run_source").scalar())


def count(store: Any, table: str) -> int:
    with store.db.connect() as conn:
        return int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar())


def raw_exec(store: Any, sql: str) -> None:
    """Run raw SQL behind the store's back (no parameters), committed."""
    with store.db.connect() as conn:
        conn.exec_driver_sql(sql)
        conn.commit()


def lease(store: Any, run_id: str) -> tuple | None:
    with store.db.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT owner_host_id, owner_pid, owner_nonce, heartbeat_at_ms, claim_host_id, claim_pid, claim_nonce, "
            f"claimed_at_ms FROM flows_consensus_leases WHERE run_id = '{run_id}'"
        ).first()


@pytest.fixture
def runs(store: Any) -> Any:
    return store.runs


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def mstore(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One store per module and backend, for tests that only need fresh run ids (faster than ``store``)."""
    import uuid

    import fencepost
    from fencepost.clock import ManualClock
    from tests.conftest import _with_schema, drop_schema, require_postgres

    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('m') / 'flows.db'}"
    else:
        base = require_postgres()
        schema = "t_" + uuid.uuid4().hex[:16]
        url = _with_schema(base, schema)
    s = fencepost.open(url, clock=ManualClock(0))
    try:
        yield s
    finally:
        s.close()
        if schema is not None:
            drop_schema(require_postgres(), schema)


def fresh(prefix: str = "r") -> str:
    import uuid

    return f"{prefix}-{uuid.uuid4().hex[:12]}"
