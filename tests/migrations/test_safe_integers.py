"""Every integer column of the run store, journal, lease and change-feed tables refuses a value past
2^53 - 1 in the database itself, so raw SQL cannot store what the contract cannot carry.

Pitfall "a NUMERIC/BIGINT beyond 2^53 - 1": the library refuses such values before binding (tested
where each is taken); this pins the other half, the database constraint, for every integer column
``_schema`` declares, on SQLite and PostgreSQL. The store is filled through its API first so that
every column holds a value in some row; each column is then set to 2^53 on one row (by primary key)
with the table's triggers out of the way (the journal's no-update trigger would refuse any update
and hide a missing bound), and the CHECK must refuse it.
"""

from __future__ import annotations

import sqlalchemy.exc
from sqlalchemy import Integer, text

import fencepost
from fencepost import Attempt, OwnerId, RunSnapshot, _schema

PENDING = RunSnapshot("pending", None, None)
A = OwnerId("host-a", 101, "owner-a")
B = OwnerId("host-b", 202, "owner-b")
UNSAFE = 2**53

# Not run state and not part of the contract: the migration ledger's ids are ours. A shard set's
# membership generation and join stamp are bounded too (migration 4004).
NOT_CONTRACT = {("flows_migrations", "migration_id")}


def _fill(store: fencepost.Store, raw) -> None:
    runs = store.runs
    runs.create("owned", "{}")
    runs.claim_and_own("owned", PENDING, A, 0)
    runs.request_cancel("owned", 5)
    store.attempts.put(Attempt(run_id="owned", step_key_digest="d", attempt=0, state="running", started_at_ms=1,
                               heartbeat_at_ms=2), A)
    store.attempts.put(Attempt(run_id="owned", step_key_digest="d", attempt=1, state="running", started_at_ms=1), A)
    store.attempts.finish(Attempt(run_id="owned", step_key_digest="d", attempt=1, state="failed", started_at_ms=1,
                                  finished_at_ms=3), A)
    runs.create("claimed", "{}")
    runs.claim("claimed", PENDING, B, 0)
    runs.create("done", "{}")
    runs.claim_and_own("done", PENDING, A, 0)
    runs.transition_owned("done", A, "completed")
    runs.create("round-1", "{}", parent_run_id="done", lineage_id="done", round_ordinal=1)
    runs.create("deleted", "{}")
    raw.exec_driver_sql("DELETE FROM flows_runs WHERE run_id = 'deleted'")  # a tombstone in the changes
    raw.exec_driver_sql("UPDATE flows_runs SET waiting_reason = 'timer', waiting_wake_at_ms = 9, "
                        "status = 'suspended' WHERE run_id = 'round-1'")
    raw.exec_driver_sql("INSERT INTO flows_shard_membership (singleton, set_id, shard_name, members_json, "
                        f"generation, joined_at_ms, founded_at_ms) VALUES (1, '{'0' * 32}', 'a', '[\"a\"]', 1, 0, 0)")
    raw.commit()


def _without_triggers(raw, table: str) -> None:
    """Inside the open transaction: the table's triggers no longer fire (rolled back afterwards)."""
    if raw.dialect.name == "postgresql":
        raw.exec_driver_sql("SET LOCAL session_replication_role = replica")
        return
    names = raw.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = :t"),
                        {"t": table}).scalars().all()
    for name in names:
        raw.exec_driver_sql(f'DROP TRIGGER "{name}"')


def test_every_contract_integer_column_refuses_2_to_the_53(store: fencepost.Store, raw) -> None:
    _fill(store, raw)
    checked, accepted = [], []
    for table in _schema.metadata.sorted_tables:
        key = [c.name for c in table.primary_key.columns]
        for column in table.c:
            if not isinstance(column.type, Integer) or (table.name, column.name) in NOT_CONTRACT:
                continue
            row = raw.exec_driver_sql(
                f"SELECT {', '.join(key)} FROM {table.name} WHERE {column.name} IS NOT NULL LIMIT 1").first()
            raw.rollback()
            assert row is not None, f"no row of {table.name} holds {column.name}: fill it first"
            where = " AND ".join(f"{k} = :k{i}" for i, k in enumerate(key))
            params = {f"k{i}": v for i, v in enumerate(row)} | {"v": UNSAFE}
            _without_triggers(raw, table.name)
            try:
                raw.execute(text(f"UPDATE {table.name} SET {column.name} = :v WHERE {where}"), params)
            except sqlalchemy.exc.IntegrityError:
                checked.append((table.name, column.name))
            except sqlalchemy.exc.DBAPIError as exc:  # PostgreSQL INTEGER columns: out of range
                assert "out of range" in str(exc.orig), exc
                checked.append((table.name, column.name))
            else:
                accepted.append((table.name, column.name))
            finally:
                raw.rollback()
    assert accepted == []
    assert len(checked) == 31  # every integer column of _schema but NOT_CONTRACT was tried
