"""A PostgreSQL role that owns nothing, given exactly the rights the backends page lists for an
application's role (USAGE on the schema; SELECT, INSERT, UPDATE and DELETE on its tables), runs a
store end to end: a writable open, a run created, claimed, activated, heartbeated and settled
with its ownership facts journaled, the change feed read, a journal append, a projection built
into its own SQLite target; and it is refused any schema change. PostgreSQL only (roles and
grants are the server's)."""

from __future__ import annotations

import os

import pytest

import fencepost
from fencepost import Activated, Claimed, OwnerId
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.migrations.test_hunt_migrations import _dml_role


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_role_with_the_documented_grants_runs_a_store(db_url, tmp_path):
    fencepost.open(db_url).close()  # the owner migrates (fencepost init)
    with _dml_role(db_url) as role_url, fencepost.open(role_url) as store:
        start = store.feed.position()
        store.runs.create("job-1", "{}")
        row = store.runs.get("job-1")
        me = OwnerId("host-a", os.getpid(), "worker-1")
        claim = store.runs.claim("job-1", row.snapshot(), me, store.clock.now_ms())
        assert isinstance(claim, Claimed)
        assert isinstance(store.runs.activate("job-1", me, claim.claimed_at_ms, row), Activated)
        store.runs.heartbeat("job-1", me, store.clock.now_ms())
        store.runs.transition_owned("job-1", me, "running", '{"step": 1}')
        accepted = store.journal.append("job-1", "step.done", {"step": 1}, owner=me, source_id="worker-1")
        assert type(accepted).__name__ == "Accepted"
        store.runs.transition_owned("job-1", me, "completed", '{"done": true}')
        assert store.runs.get("job-1").status == "completed"
        assert [c.run_id for c in store.feed.changes_since(start, limit=10).changes] == ["job-1"]
        target = f"sqlite:///{tmp_path / 'model.db'}"
        with ProjectionBuilder(store, target, RunsByStatus()) as builder:
            builder.catch_up()
        with pytest.raises(Exception) as refused:
            store.db.write(lambda conn: conn.exec_driver_sql("CREATE TABLE not_allowed (x int)"))
        assert "permission" in str(refused.value).lower() or "42501" in str(refused.value)


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_role_with_select_only_reads_the_store(db_url):
    """The backends page: read-only uses need SELECT only."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from tests.conftest import require_postgres

    with fencepost.open(db_url) as owner:
        owner.runs.create("job-1", "{}")
    with _dml_role(db_url) as role_url:
        role = role_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]
        schema = db_url.rsplit("schema=", 1)[1]
        admin = create_engine(require_postgres(), poolclass=NullPool, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f"REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} FROM {role}")
        admin.dispose()
        with fencepost.open(role_url, readonly=True) as store:
            assert store.runs.get("job-1").status == "pending"
            assert [r.run_id for r in store.feed.iter_runs()] == ["job-1"]
        with pytest.raises(fencepost.OpenError) as refused:
            fencepost.open(role_url)
        assert refused.value.code == "permission_denied"
