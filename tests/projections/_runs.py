"""Raw-SQL run mutations for projection tests (the triggers track raw writes like any other)."""

from __future__ import annotations

import random
from typing import Any

from sqlalchemy import text

_CREATE = text(
    "INSERT INTO flows_runs (run_id, status, state_json, created_at_ms) VALUES (:run_id, 'pending', :state, :t)"
)
_RUNNING = text(
    "UPDATE flows_runs SET status = 'running', owner_host_id = :host, owner_pid = :pid, owner_nonce = :nonce, "
    "heartbeat_at_ms = :t, started_at_ms = COALESCE(started_at_ms, :t) WHERE run_id = :run_id"
)
_HEARTBEAT = text("UPDATE flows_runs SET heartbeat_at_ms = :t WHERE run_id = :run_id AND status = 'running'")
_SETTLE = text(
    "UPDATE flows_runs SET status = :status, owner_host_id = NULL, owner_pid = NULL, owner_nonce = NULL, "
    "heartbeat_at_ms = NULL, finished_at_ms = :t WHERE run_id = :run_id"
)
_CANCEL = text("UPDATE flows_runs SET cancel_requested_at_ms = :t WHERE run_id = :run_id")
_DELETE = text("DELETE FROM flows_runs WHERE run_id = :run_id")


def create(conn: Any, run_id: str, t: int = 0, flow: str = "demo") -> None:
    conn.execute(_CREATE, {"run_id": run_id, "state": f'{{"flowName": "{flow}"}}', "t": t})


def create_many(conn: Any, run_ids: list[str], first_t: int = 0, flow: str = "demo") -> None:
    """``create`` of each id, the i-th at ``first_t + i``, as one executemany (one round trip per
    batch on PostgreSQL, not one per run): the triggers still fire for every row."""
    state = f'{{"flowName": "{flow}"}}'
    conn.execute(_CREATE, [{"run_id": r, "state": state, "t": first_t + i} for i, r in enumerate(run_ids)])


def start(conn: Any, run_id: str, t: int = 0, host: str = "host-a", pid: int = 1, nonce: str = "n1") -> None:
    conn.execute(_RUNNING, {"run_id": run_id, "t": t, "host": host, "pid": pid, "nonce": nonce})


def heartbeat(conn: Any, run_id: str, t: int) -> None:
    conn.execute(_HEARTBEAT, {"run_id": run_id, "t": t})


def settle(conn: Any, run_id: str, status: str = "completed", t: int = 0) -> None:
    conn.execute(_SETTLE, {"run_id": run_id, "status": status, "t": t})


def cancel(conn: Any, run_id: str, t: int = 0) -> None:
    conn.execute(_CANCEL, {"run_id": run_id, "t": t})


def delete(conn: Any, run_id: str) -> None:
    conn.execute(_DELETE, {"run_id": run_id})


def random_mutation(conn: Any, rng: random.Random, ids: list[str], prefix: str, t: int) -> None:
    """One random create, start, heartbeat, settle, cancel or delete (ids tracks live run ids)."""
    roll = rng.random()
    if roll < 0.3 or not ids:
        run_id = f"{prefix}-{rng.getrandbits(48):012x}"
        create(conn, run_id, t)
        ids.append(run_id)
        return
    run_id = rng.choice(ids)
    if roll < 0.5:
        start(conn, run_id, t, pid=rng.randint(1, 9))
    elif roll < 0.65:
        heartbeat(conn, run_id, t)
    elif roll < 0.8:
        settle(conn, run_id, rng.choice(["completed", "failed", "cancelled"]), t)
    elif roll < 0.9:
        cancel(conn, run_id, t)
    else:
        delete(conn, run_id)
        ids.remove(run_id)


def live_rows(conn: Any) -> dict[str, tuple[Any, ...]]:
    """What ``RunsByStatus`` should hold, read straight from ``flows_runs``."""
    rows = conn.execute(text(
        "SELECT run_id, status, owner_host_id, owner_pid, owner_nonce, created_at_ms, started_at_ms, "
        "finished_at_ms, cancel_requested_at_ms FROM flows_runs"
    ))
    return {r[0]: tuple(r[1:]) for r in rows}


def projected_rows(conn: Any, table: str = "projection_runs_by_status") -> dict[str, tuple[Any, ...]]:
    rows = conn.execute(text(
        "SELECT run_id, status, owner_host_id, owner_pid, owner_nonce, created_at_ms, started_at_ms, "
        f"finished_at_ms, cancel_requested_at_ms FROM {table}"
    ))
    return {r[0]: tuple(r[1:]) for r in rows}


def projected_rows_fn(table: str):
    """``projected_rows`` for ``table`` as a callable for ``Database.read``."""
    return lambda conn: projected_rows(conn, table)
