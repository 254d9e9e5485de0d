"""Migrations 3001 to 3005 create exactly the builder tables ``projections._sql`` declares, on both backends."""

from __future__ import annotations

from sqlalchemy import inspect, text

from fencepost._durable import Database
from fencepost._migrations import migrate
from fencepost.projections import _sql


def test_projection_migration_matches_the_declared_tables(db_url):
    db = Database(db_url)
    try:
        assert migrate(db, ("projections",)) == [3001, 3002, 3003, 3004, 3005]
        assert migrate(db, ("projections",)) == []  # idempotent

        def reflect(conn):
            insp = inspect(conn)
            return {
                t.name: ({c["name"] for c in insp.get_columns(t.name, schema=db.schema)},
                         insp.get_pk_constraint(t.name, schema=db.schema)["constrained_columns"])
                for t in _sql.metadata.sorted_tables
            }

        found = db.read(reflect)
        for table in _sql.metadata.sorted_tables:
            columns, pk = found[table.name]
            assert columns == {c.name for c in table.columns}, table.name
            assert sorted(pk) == sorted(c.name for c in table.primary_key.columns), table.name
    finally:
        db.dispose()


def test_a_target_built_before_3002_keeps_its_projection_and_is_upgraded_by_the_next_builder(
        db_url, make_db_url, monkeypatch):
    """A single-source projection built when only 3001 existed: a read-only ``status`` still reads
    its position before 3002 is applied, and the next builder applies 3002 and carries on."""
    import fencepost
    from fencepost import _migrations
    from fencepost.projections import ProjectionBuilder, RunsByStatus
    from tests.projections import _runs

    shipped = _migrations.discover
    store = fencepost.open(db_url)
    target_url = make_db_url()
    try:
        store.db.write(lambda conn: [_runs.create(conn, f"old-{i}", i) for i in range(5)])
        # 3005 rebuilds the checkpoint table with 3002's columns: it waits with 3002.
        monkeypatch.setattr(_migrations, "discover",
                            lambda *a, **k: [m for m in shipped(*a, **k) if m.id not in (3002, 3005)])
        # What the builder did before 3002: no look at the columns 3002 adds.
        monkeypatch.setattr("fencepost.projections.checkpoints.share_of", lambda conn, name: None)
        monkeypatch.setattr("fencepost.projections.checkpoints.has_shares", lambda conn, name: False)
        with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
            built = builder.catch_up()
        monkeypatch.undo()
        readonly = Database(target_url, readonly=True)
        try:
            assert 3002 not in _migrations.applied(readonly)
            with ProjectionBuilder(store, readonly, RunsByStatus()) as reader:
                status = reader.status()
        finally:
            readonly.dispose()
        assert (status.applied_revision, status.lag) == (built.revision, 0)

        store.db.write(lambda conn: _runs.create(conn, "new-0", 9))
        with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
            assert builder.catch_up().applied == 1
            assert 3002 in _migrations.applied(builder.target)
    finally:
        store.close()


def test_held_revisions_survive_3003_and_sqlite_keeps_them_without_rowid(db_url, make_db_url, monkeypatch):
    """A target built before 3003: the next builder applies it, every held revision is kept (a page
    of already-applied updates is still rejected as stale), and on SQLite the builder's revision
    tables and the built-in projections' tables are stored WITHOUT ROWID."""
    import fencepost
    from fencepost import _migrations
    from fencepost.projections import OwnershipHistory, ProjectionBuilder, RunsByStatus
    from tests.projections import _runs

    shipped = _migrations.discover
    store = fencepost.open(db_url)
    target_url = make_db_url()
    try:
        store.db.write(lambda conn: [_runs.create(conn, f"old-{i}", i) for i in range(5)])
        # 3005 rebuilds the revision tables as 3003 leaves them: it waits with 3003.
        monkeypatch.setattr(_migrations, "discover",
                            lambda *a, **k: [m for m in shipped(*a, **k) if m.id not in (3003, 3005)])
        with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
            assert builder.catch_up().applied == 5
            assert 3003 not in _migrations.applied(builder.target)
            held = builder.target.read(lambda conn: sorted(conn.execute(text(
                "SELECT name, run_id, source, revision FROM projection_run_revisions")).all()))
        monkeypatch.undo()
        assert len(held) == 5

        with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
            assert builder.catch_up().applied == 0
            target = builder.target
            assert 3003 in _migrations.applied(target)
            assert target.read(lambda conn: sorted(conn.execute(text(
                "SELECT name, run_id, source, revision FROM projection_run_revisions")).all())) == held
            # Replaying the first page against the kept revisions: every update is stale.
            assert builder._write(lambda conn: builder._apply_in(
                conn, builder._shares[0], held[0][2], store.feed.changes_with_snapshots(
                    fencepost.changefeed.Position(held[0][2], 0), 5).snapshots, shadow=False)) == (0, 5)
            store.db.write(lambda conn: _runs.create(conn, "new-0", 9))
            assert builder.catch_up().applied == 1
        with ProjectionBuilder(store, target_url, OwnershipHistory()) as history:
            history.catch_up()
            if target.backend.name == "sqlite":
                ddl = dict(history.target.read(lambda conn: conn.execute(text(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'table'")).all()))
                for name in ("projection_run_revisions", "projection_run_revisions_shadow",
                             "projection_runs_by_status", "projection_runs_by_status__shadow",
                             "projection_ownership_history", "projection_ownership_history__shadow"):
                    assert ddl[name].rstrip().endswith("WITHOUT ROWID"), name
    finally:
        store.close()
