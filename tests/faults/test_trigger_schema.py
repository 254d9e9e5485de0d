"""Issue 10 defect 6: PostgreSQL trigger functions are pinned to their own schema.

The revision, lease-release and notify trigger functions used to resolve ``flows_run_source`` /
``flows_run_changes`` through the *writer's* ``search_path``: a raw ``UPDATE <schema>.flows_runs``
from a session with the default path failed with ``UndefinedTable``, and from a session whose path
named another store's schema it advanced the other store's revision and wrote this run into the
other store's feed. PostgreSQL only (SQLite has no schemas; its triggers name their own file).
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

import fencepost
from fencepost.errors import JournalError
from fencepost.journal import OwnerId
from tests.conftest import drop_schema, require_postgres

A = OwnerId("host-a", 1, "nonce-a")


def _conninfo() -> str:
    return require_postgres().replace("postgresql+psycopg://", "postgresql://")


def _schema(store: fencepost.Store) -> str:
    return store.db.schema


@pytest.fixture
def two_stores(clock):
    """Two stores in two fresh schemas of the one test database."""
    base = require_postgres()
    schemas = ["t_" + uuid.uuid4().hex[:16] for _ in range(2)]
    stores = [fencepost.open(f"{base}?schema={s}", clock=clock) for s in schemas]
    try:
        yield stores[0], stores[1]
    finally:
        for s in stores:
            s.close()
        for schema in schemas:
            drop_schema(base, schema)


def test_raw_update_from_a_default_search_path_session_advances_its_own_store(two_stores) -> None:
    """A session that never set ``search_path`` updates ``<schema>.flows_runs`` by qualified name:
    the statement works and advances that store's revision, and its feed hands out the change."""
    a, _ = two_stores
    a.runs.create("run-1", '{"flowName": "f"}')
    before = a.feed.position()
    with psycopg.connect(_conninfo(), autocommit=True) as conn:
        path = conn.execute("SHOW search_path").fetchone()[0]
        assert _schema(a) not in path
        conn.execute(f'UPDATE "{_schema(a)}".flows_runs SET state_json = %s WHERE run_id = %s',
                     ('{"flowName": "g"}', "run-1"))
    after = a.feed.position()
    assert after.revision == before.revision + 1
    changes = a.feed.changes_since(before).changes
    assert [(c.run_id, c.revision) for c in changes] == [("run-1", after.revision)]
    assert a.feed.read(["run-1"]).snapshots[0].flow_name == "g"


def test_raw_writes_from_a_session_on_another_schema_touch_only_the_named_store(two_stores) -> None:
    """Two stores in two schemas of one database; a session whose ``search_path`` is B inserts,
    updates and deletes A's runs by qualified name. A's revision advances and A's consumers see each
    change; B's revision, change rows and feed are untouched."""
    a, b = two_stores
    a.runs.create("run-a", '{"flowName": "f"}')
    b.runs.create("run-b", '{"flowName": "f"}')
    a0, b0 = a.feed.position(), b.feed.position()
    with psycopg.connect(_conninfo(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{_schema(b)}"')
        qa = f'"{_schema(a)}".flows_runs'
        conn.execute(f"UPDATE {qa} SET state_json = %s WHERE run_id = 'run-a'", ('{"flowName": "g"}',))
        conn.execute(f"INSERT INTO {qa} (run_id, status, state_json, created_at_ms)"
                     " VALUES ('new-a', 'pending', '{}', 5)")
        conn.execute(f"DELETE FROM {qa} WHERE run_id = 'run-a'")
    assert b.feed.position() == b0
    assert b.feed.changes_since(b0).changes == []
    assert [s.run_id for s in b.feed.read(["run-b", "run-a", "new-a"]).snapshots] == ["run-b", "run-a", "new-a"]
    assert type(b.feed.read(["run-a"]).snapshots[0]).__name__ == "Missing"
    a1 = a.feed.position()
    assert a1.revision == a0.revision + 3
    seen = {(c.run_id, c.deleted) for c in a.feed.changes_since(a0).changes}
    assert seen == {("run-a", True), ("new-a", False)}


def test_follower_of_a_sees_a_raw_write_made_from_b_search_path(two_stores) -> None:
    """A's live follower is woken (NOTIFY names A's schema) and reads the change; B's sees nothing."""
    import threading

    a, b = two_stores
    a.runs.create("seed", "{}")
    stop = threading.Event()
    got: list[str] = []
    start = a.feed.position()

    def follow() -> None:
        for change in a.feed.follow(start, stop=stop, poll_interval=30):
            got.append(change.run_id)
            stop.set()

    t = threading.Thread(target=follow)
    t.start()
    try:
        with psycopg.connect(_conninfo(), autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{_schema(b)}"')
            conn.execute(f"UPDATE \"{_schema(a)}\".flows_runs SET state_json = '[1]' WHERE run_id = 'seed'")
        t.join(10)  # far below the 30 s poll: only the notification can wake it this soon
    finally:
        stop.set()
        t.join(10)
    assert got == ["seed"]
    assert b.feed.position().revision == 0


def test_raw_delete_from_another_schema_releases_the_named_stores_lease(two_stores, clock) -> None:
    """The lease-release trigger (defect 7) is pinned too: deleting A's running run from a session on
    B's path drops A's lease (A's owner is fenced out), and B's leases stay."""
    a, b = two_stores
    for s in (a, b):
        s.runs.create("same-id", "{}")
        s.runs.claim_and_own("same-id", s.runs.get("same-id").snapshot(), A, clock.now_ms())
    with psycopg.connect(_conninfo(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{_schema(b)}"')
        conn.execute(f"DELETE FROM \"{_schema(a)}\".flows_runs WHERE run_id = 'same-id'")
    with pytest.raises(JournalError) as err:
        a.journal.append("same-id", "late", {}, owner=A, source_id="engine")
    assert err.value.code == "fence_lost"
    assert b.journal.append("same-id", "still-held", {}, owner=A, source_id="engine").seq == 0
