"""Migration runner and schema checks found by a hunt (both backends, real databases).

- a projection target's pending migrations (3xxx) show in ``migrations status`` and ``migrations
  sql`` once the database's ledger records any, and a builder refused the rights to apply them
  names them;
- a trigger that maintains the store (revisions, tombstones, lease release, notifications) or a
  column of the store's tables missing is refused at open, writable and read-only, and shown by
  ``migrations status``;
- a shard member whose ``joined_at_ms`` is past 2^53 - 1 upgrades from before 4002;
- a migration that fails for any reason names itself;
- a read-only open racing another process's migration opens instead of saying "0 pending";
- a writable open refused the rights to migrate names the pending migrations.
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.pool import NullPool

import fencepost
from fencepost import _migrations
from fencepost._durable import Database
from fencepost.errors import OpenError, ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.conftest import ledger_of, require_postgres

SAFE = 2**53 - 1


def _cli(*args: str) -> tuple[int, str, str]:
    from fencepost.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _without(*ids: int) -> Iterator[None]:
    """Migrations run in this block as a version that did not ship ``ids`` would run them."""
    shipped = _migrations.discover
    patch = pytest.MonkeyPatch()
    patch.setattr(_migrations, "discover", lambda *a, **k: [m for m in shipped(*a, **k) if m.id not in ids])
    try:
        yield
    finally:
        patch.undo()


def _write(url: str, sql: str) -> None:
    db = Database(url)
    try:
        db.write(lambda conn: conn.exec_driver_sql(sql))
    finally:
        db.dispose()


@contextlib.contextmanager
def _dml_role(url: str, *, create: bool = False) -> Iterator[str]:
    """The URL of a new PostgreSQL role that may read and write the rows of ``url``'s schema (and
    create tables in it, with ``create``) but owns none of its tables: an application's role."""
    role = "fp_dml_" + uuid.uuid4().hex[:8]
    schema = url.rsplit("schema=", 1)[1]
    admin = create_engine(require_postgres(), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.exec_driver_sql(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}")
        if create:
            conn.exec_driver_sql(f"GRANT CREATE ON SCHEMA {schema} TO {role}")
    try:
        yield make_url(url).set(username=role).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")
        admin.dispose()


# --------------------------------------------------------------------------- 1: projection migrations


def _store_with_target_before_3005(url: str) -> None:
    """A store whose database is also a projection target, as the version before 3005 left it."""
    with _without(3005):
        fencepost.open(url).close()
        db = Database(url)
        try:
            assert _migrations.migrate(db, ("projections",)) == [3001, 3002, 3003, 3004]
        finally:
            db.dispose()
    assert 3004 in ledger_of(url) and 3005 not in ledger_of(url)


def test_a_pending_projection_migration_shows_in_status_and_sql(db_url):
    _store_with_target_before_3005(db_url)
    code, out, err = _cli("--db", db_url, "migrations", "status", "--json")
    assert code == 0, (out, err)
    states = {r["id"]: r["state"] for r in json.loads(out)}
    assert states[3005] == "pending" and states[3004] == "applied", states
    code, out, _ = _cli("--db", db_url, "migrations", "status")
    assert "1 pending" in out and "projection builder" in out, out
    code, out, err = _cli("--db", db_url, "migrations", "sql")
    assert code == 0 and "nothing to apply" not in out, out
    assert "-- 3005 projections_safe_integers" in out and "-- 1001" not in out, out
    code, out, _ = _cli("--db", db_url, "migrations", "sql", "--json")
    assert json.loads(out)["pending"] == [3005]
    assert 3005 not in ledger_of(db_url)  # status and sql change nothing


def test_a_store_that_never_held_a_projection_lists_no_projection_migration(db_url):
    fencepost.open(db_url).close()
    code, out, _ = _cli("--db", db_url, "migrations", "status", "--json")
    assert code == 0 and not [r for r in json.loads(out) if 3000 < r["id"] < 4000], out
    assert "nothing to apply" in _cli("--db", db_url, "migrations", "sql")[1]


def test_a_projection_target_of_its_own_lists_the_projection_migrations_only(make_db_url):
    target = make_db_url()
    with _without(3005):
        db = Database(target)
        try:
            _migrations.migrate(db, ("projections",))
        finally:
            db.dispose()
    code, out, _ = _cli("--db", target, "migrations", "status", "--json")
    assert code == 0
    assert {r["id"]: r["state"] for r in json.loads(out)} == {
        3001: "applied", 3002: "applied", 3003: "applied", 3004: "applied", 3005: "pending"}, out
    sql = _cli("--db", target, "migrations", "sql")[1]
    assert "-- 3005 " in sql and "flows_runs" not in sql, sql
    # A target not built yet: --projections prints its whole schema, and nothing of a store's.
    fresh = make_db_url()
    sql = _cli("--db", fresh, "migrations", "sql", "--projections")[1]
    assert "-- 3001 " in sql and "-- 3005 " in sql and "-- 1001 " not in sql, sql


def test_a_builder_refused_the_rights_to_migrate_names_the_pending_migrations(pg_url):
    _store_with_target_before_3005(pg_url)
    with _dml_role(pg_url, create=True) as role_url, fencepost.open(role_url) as store:
        store.runs.create("r1", "{}")
        builder = ProjectionBuilder(store, role_url, RunsByStatus())
        try:
            with pytest.raises(ProjectionError) as err:
                builder.catch_up()
        finally:
            builder.close()
    assert err.value.code == "permission_denied", err.value
    assert "1 migration(s) pending (3005)" in str(err.value) and "migrations sql" in str(err.value), err.value
    assert 3005 not in ledger_of(pg_url)


# --------------------------------------------------------------------------- 2: a schema changed by hand


def _drop_trigger(url: str, name: str, table: str) -> None:
    _write(url, f"DROP TRIGGER {name}" + (f" ON {table}" if url.startswith("postgresql") else ""))


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "readonly"])
def test_a_dropped_revision_trigger_is_refused_at_open(db_url, readonly):
    with fencepost.open(db_url) as store:
        store.runs.create("a", "{}")
    _drop_trigger(db_url, "flows_runs_revision_update", "flows_runs")
    with pytest.raises(OpenError) as err:
        fencepost.open(db_url, readonly=readonly)
    assert err.value.code == "schema_mismatch", err.value
    assert "trigger flows_runs_revision_update" in str(err.value), err.value
    code, out, _ = _cli("--db", db_url, "migrations", "status")
    assert code == 1 and "trigger flows_runs_revision_update" in out, out
    maker = "1003" if db_url.startswith("postgresql") else "1002"  # SQLite's 1003 leaves the triggers as they are
    row = next(line for line in out.splitlines() if line.startswith(maker))
    assert "altered" in row and f"(migration {maker})" in out, out


def test_a_dropped_trigger_is_refused_by_the_open_that_migrates_too(db_url):
    with _without(4004):
        fencepost.open(db_url).close()
    _drop_trigger(db_url, "flows_runs_release_lease_v1", "flows_runs")
    with pytest.raises(OpenError) as err:
        fencepost.open(db_url)
    assert err.value.code == "schema_mismatch" and "trigger flows_runs_release_lease_v1 (migration 1005)" in str(
        err.value), err.value


def test_a_dropped_table_is_named_as_a_table(db_url):
    fencepost.open(db_url).close()
    _write(db_url, "DROP TABLE flows_attempts")
    with pytest.raises(OpenError) as err:
        fencepost.open(db_url, readonly=True)
    assert "a table or column fencepost needs is missing" in str(err.value), err.value
    said = str(err.value)
    assert "table flows_attempts (migration 1001)" in said and "column flows_" not in said, said


def test_a_disabled_revision_trigger_is_refused_at_open(pg_url):
    fencepost.open(pg_url).close()
    _write(pg_url, "ALTER TABLE flows_runs DISABLE TRIGGER flows_runs_revision_delete")
    with pytest.raises(OpenError) as err:
        fencepost.open(pg_url)
    assert err.value.code == "schema_mismatch" and "trigger flows_runs_revision_delete" in str(err.value)


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "readonly"])
def test_a_renamed_column_is_refused_at_open(db_url, readonly):
    with fencepost.open(db_url) as store:
        store.runs.create("a", "{}")
    _write(db_url, "ALTER TABLE flows_runs RENAME COLUMN waiting_token TO waiting_tok")
    with pytest.raises(OpenError) as err:
        fencepost.open(db_url, readonly=readonly)
    assert err.value.code == "schema_mismatch", err.value
    assert "column flows_runs.waiting_token" in str(err.value), err.value
    code, out, _ = _cli("--db", db_url, "migrations", "status", "--json")
    assert code == 1 and {r["id"]: r["state"] for r in json.loads(out)}[1001] == "altered", out


def test_guards_dropped_to_edit_the_journal_still_open(db_url):
    """The journal's append-only triggers refuse hand edits; without them the store still opens
    (``journal verify`` finds the edits), as do extra triggers and columns."""
    fencepost.open(db_url).close()
    _drop_trigger(db_url, "flows_journal_events_no_update_v1", "flows_journal_events")
    _write(db_url, "ALTER TABLE flows_runs ADD COLUMN note TEXT")
    fencepost.open(db_url).close()
    fencepost.open(db_url, readonly=True).close()
    assert _cli("--db", db_url, "migrations", "status")[0] == 0


# --------------------------------------------------------------------------- 3: 4003 and a stamp past the bound


def test_a_member_whose_stamp_is_past_the_bound_upgrades_from_before_4002(db_url):
    with _without(4002, 4003, 4004):
        with fencepost.open(db_url) as store:
            store.runs.create("r-1", "{}")
            store.db.write(lambda conn: conn.exec_driver_sql(
                "INSERT INTO flows_shard_membership (singleton, set_id, shard_name, members_json, generation, "
                f"joined_at_ms) VALUES (1, '{'a' * 32}', 'shard-0', '[\"shard-0\",\"shard-1\"]', 1, {SAFE + 8})"))
    with fencepost.open(db_url) as store:
        assert store.migrations_applied == (4002, 4003, 4004)
        row = store.db.read(lambda conn: tuple(conn.exec_driver_sql(
            "SELECT joined_at_ms, founded_at_ms FROM flows_shard_membership").one()))
    assert row == (SAFE, SAFE)


def test_the_sql_for_a_dba_clamps_the_stamp_before_4003_too(db_url):
    with _without(4002, 4003, 4004):
        fencepost.open(db_url).close()
    sql = _cli("--db", db_url, "migrations", "sql")[1]
    clamp = sql.index(f"SET joined_at_ms = {SAFE} WHERE joined_at_ms > {SAFE}")
    assert sql.index("\n-- 4003 ") < clamp < sql.index("SET founded_at_ms = joined_at_ms"), sql


def test_a_migration_a_row_breaks_names_what_failed(db_url):
    """A generation past the bound (a hand edit) fails 4004: the message names the migration and
    does not say it adds the constraint the row broke."""
    with _without(4004):
        with fencepost.open(db_url) as store:
            store.db.write(lambda conn: conn.exec_driver_sql(
                "INSERT INTO flows_shard_membership (singleton, set_id, shard_name, members_json, generation, "
                f"joined_at_ms, founded_at_ms) VALUES (1, '{'a' * 32}', 'shard-0', '[\"shard-0\"]', {SAFE + 1}, 5, 5)"))
    with pytest.raises(OpenError) as err:
        fencepost.open(db_url)
    assert err.value.code == "open_failed"
    assert ("migration 4004 (shards_safe_integers) could not be applied: a row breaks a constraint; "
            "no migration was applied") in str(err.value), err.value


# --------------------------------------------------------------------------- 4: any failing migration names itself


def test_a_migration_failing_for_another_reason_names_itself(db_url):
    fencepost.open(db_url).close()
    _write(db_url, "DELETE FROM flows_migrations WHERE migration_id = 1007")
    with pytest.raises(OpenError) as err:
        fencepost.open(db_url)
    assert err.value.code == "open_failed", err.value
    assert "migration 1007 (run-store_claims_index) could not be applied" in str(err.value), err.value
    assert "already exists" in str(err.value) and "no migration was applied" in str(err.value), err.value
    assert 1007 not in ledger_of(db_url)


# --------------------------------------------------------------------------- 5: a read-only open racing a migration


def test_a_read_only_open_racing_a_migration_opens(db_url, monkeypatch):
    """Another process migrates the store while a read-only open looks at it: the open reads the
    ledger once and goes by what it read. It used to read it twice and, the migration done in
    between, said "needs migrating: 0 migration(s) pending ()"."""
    with _without(1003, 1004, 1005, 1006, 1007, 2001, 2002, 4001, 4002, 4003, 4004):
        fencepost.open(db_url).close()
    real = _migrations._applied
    reads: list[bool] = []

    def racing(conn, db):  # the other process's migration commits before a second look at the ledger
        if db.readonly:
            reads.append(True)
            if len(reads) == 2:
                other = Database(db_url)
                try:
                    _migrations.migrate(other)
                finally:
                    other.dispose()
        return real(conn, db)

    monkeypatch.setattr(_migrations, "_applied", racing)
    with pytest.raises(OpenError) as err:
        fencepost.open(db_url, readonly=True)
    assert err.value.code == "needs_migrations", err.value
    assert "0 migration(s)" not in str(err.value) and "11 migration(s) pending" in str(err.value), err.value
    assert len(reads) == 1


# --------------------------------------------------------------------------- 6: a writable open without the rights


def test_a_writable_open_without_the_rights_names_the_pending_migrations(pg_url):
    with _without(4004):
        fencepost.open(pg_url).close()
    with _dml_role(pg_url) as role_url:
        with pytest.raises(OpenError) as err:
            fencepost.open(role_url)
    assert err.value.code == "permission_denied", err.value
    assert str(err.value).count("1 migration(s) pending (4004)") == 1, err.value
    assert 4004 not in ledger_of(pg_url)


def test_every_column_and_maintaining_trigger_is_checked_and_a_fresh_store_lacks_none(db_url):
    """The open's check covers every column of the store's tables and the triggers that write
    (a migration adding one is covered without a list to keep), and finds nothing amiss in a
    store just made."""
    from fencepost import _schema

    fencepost.open(db_url).close()
    db = Database(db_url, readonly=True)
    _migrations._MAKERS.clear()  # made afresh from the files as shipped
    try:
        triggers, columns = _migrations._makers(db)
        assert db.read(lambda conn: _migrations.damage(conn, db, _migrations._applied(conn, db))) == []
    finally:
        db.dispose()
    assert {(t.name, c.name) for t in _schema.metadata.sorted_tables if t.name != "flows_migrations"
            for c in t.columns} == set(columns)
    assert {"flows_runs_revision_insert", "flows_runs_revision_update", "flows_runs_revision_delete",
            "flows_runs_release_lease_v1"} <= set(triggers)
    assert not any("no_update" in t or "immutable" in t for t in triggers)


def test_init_without_the_rights_names_the_pending_migrations_once(pg_url):
    """``fencepost init`` as a role that may write rows but not change the schema: the refusal
    names the pending migration once (the open's refusal names it, and init used to add it again)."""
    from click.testing import CliRunner

    from fencepost.cli import cli

    with _without(4004):
        fencepost.open(pg_url).close()
    with _dml_role(pg_url) as role_url:
        result = CliRunner().invoke(cli, ["--db", role_url, "init"])
    said = str(result.exception)  # the command line's boundary prints this as its one Error: line
    assert isinstance(result.exception, OpenError) and result.exception.code == "permission_denied", said
    assert said.count("pending (4004)") == 1, said
    assert 4004 not in ledger_of(pg_url)
