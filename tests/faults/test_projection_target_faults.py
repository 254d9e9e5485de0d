"""A projection target that fails under a builder after its first call: the PostgreSQL server
stopped (a private ``initdb`` instance, ``pg_ctl``, never the shared one), or the SQLite target's
file system remounted read-only (a tmpfs).

The next call fails as a ``ProjectionError`` naming nothing but the target (it was the driver's own
exception quoting the server's address, or a bare ``OSError``), applies nothing, and once the fault
is gone the same builder catches up.
"""

from __future__ import annotations

import os

import pytest

import fencepost
from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.faults.conftest import assert_value_free

pytestmark = pytest.mark.slow


def test_a_stopped_target_server_fails_as_fencepost_then_the_same_builder_works(private_server, tmp_path):
    with fencepost.open(f"sqlite:///{tmp_path / 'flows.db'}") as store:
        store.runs.create("r1", "{}")
        store.runs.create("r2", "{}")
        with ProjectionBuilder(store, private_server.url, RunsByStatus()) as builder:
            assert builder.status().applied_revision == 0  # the target was reached once
            private_server.stop()
            with pytest.raises(ProjectionError) as caught:
                builder.catch_up()
            assert caught.value.code in ("persistence_failed", "cannot_connect"), caught.value
            assert caught.value.transient is True  # type: ignore[attr-defined]  # the server may come back
            assert caught.value.__context__ is None  # the driver's exception is not carried along
            assert_value_free(caught.value)
            private_server.start()
            assert builder.status().applied_revision == 0  # nothing of the failed call landed
            assert builder.catch_up().applied == 2
            assert builder.status().lag == 0



def _built_target(store, target: str) -> None:
    store.runs.create("r1", "{}")
    with ProjectionBuilder(store, target, RunsByStatus()) as first:
        assert first.catch_up().applied == 1  # the target exists, with its checkpoint
    store.runs.create("r2", "{}")


def test_a_target_on_media_gone_read_only_is_refused_at_once_then_the_same_builder_works(readonly_mount, tmp_path):
    target = f"sqlite:///{readonly_mount.root / 'projection.db'}"
    with fencepost.open(f"sqlite:///{tmp_path / 'flows.db'}") as store:
        _built_target(store, target)
        with ProjectionBuilder(store, target, RunsByStatus()) as builder:
            readonly_mount.set_readonly(True)  # before the builder's first call
            try:
                with pytest.raises(ProjectionError) as caught:
                    builder.catch_up()
            finally:
                readonly_mount.set_readonly(False)
            assert caught.value.code == "permission_denied" and caught.value.__context__ is None, caught.value
            assert caught.value.transient is False  # type: ignore[attr-defined]
            assert_value_free(caught.value)
            assert builder.catch_up().applied == 1
            assert builder.status().lag == 0


def test_a_target_gone_read_only_after_its_first_call_fails_at_the_lock_then_the_same_builder_works(
        readonly_mount, tmp_path):
    """Reached once (``status``), then its media went read-only: taking the builder's lock (a file
    beside the database) failed with a bare ``OSError``."""
    target = f"sqlite:///{readonly_mount.root / 'projection.db'}"
    with fencepost.open(f"sqlite:///{tmp_path / 'flows.db'}") as store:
        _built_target(store, target)
        with ProjectionBuilder(store, target, RunsByStatus()) as builder:
            assert builder.status().lag > 0  # the target was reached
            builder.target.dispose()  # no file of the target open for writing: the remount is allowed
            readonly_mount.set_readonly(True)
            try:
                with pytest.raises(ProjectionError) as caught:
                    builder.catch_up()
            finally:
                readonly_mount.set_readonly(False)
            assert caught.value.code == "persistence_failed" and caught.value.__context__ is None, caught.value
            assert "lock file" in str(caught.value) and "EROFS" in str(caught.value), caught.value
            assert caught.value.transient is False  # type: ignore[attr-defined]  # waiting does not cure it
            assert_value_free(caught.value)
            assert builder.status().lag > 0  # nothing of the failed call landed
            assert builder.catch_up().applied == 1
            assert builder.status().lag == 0


def _catch_up_error(source: str, target: str) -> tuple[str, str, str | None, bool]:
    """Catch a builder of ``target`` up from ``source``: the refusal's code, text, db_code, transient."""
    with fencepost.open(source) as store, ProjectionBuilder(store, target, RunsByStatus()) as builder:
        try:
            builder.catch_up()
        except ProjectionError as exc:
            assert_value_free(exc)
            return exc.code, str(exc), exc.db_code, exc.transient  # type: ignore[attr-defined]
        return "applied", "", None, False


def test_a_target_file_the_builder_may_not_write_is_permission_denied_naming_it(tmp_path):
    """A built SQLite target whose file its builder may read but not write (0444, in a directory it
    may write, so its lock file is made): the builder failed with ``persistence_failed`` at
    ``Projection.apply`` (it was preparing its tables, not applying), where ``fencepost.open`` of the
    same file says ``permission_denied`` naming it. Now the same code and words as the open, from
    ``Projection.prepare``; the file is untouched. SQLite only: the PostgreSQL counterpart (a role
    that may read the target's schema but not write it) is the next test, on a private server.
    Run in a forked child as ``nobody`` (root ignores file permissions)."""
    import shutil
    import tempfile
    from pathlib import Path

    from tests.faults.conftest import unprivileged

    home = Path(tempfile.mkdtemp(prefix="fencepost-rotarget-"))  # under /tmp: reachable by nobody
    try:
        source, target = f"sqlite:///{home / 'flows.db'}", f"sqlite:///{home / 'read-model.db'}"
        with fencepost.open(source) as store:
            _built_target(store, target)
        os.chmod(home, 0o755)
        for path in [home, *home.iterdir()]:
            os.chown(path, 65534, 65534)
        (home / "read-model.db").chmod(0o444)
        before = (home / "read-model.db").read_bytes()
        code, text, db_code, transient = unprivileged(_catch_up_error, source, target)
        assert (code, db_code, transient) == ("permission_denied", "SQLITE_READONLY", False), text
        assert text.startswith("permission_denied: Projection.prepare: projection target: "), text
        assert "read-model.db" in text and "for writing" in text, text
        assert (home / "read-model.db").read_bytes() == before
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_target_schema_the_role_may_not_write_is_permission_denied(private_server, tmp_path):
    """PostgreSQL's counterpart: a built target whose schema the builder's role may use and read but
    not write was ``persistence_failed`` (db_code 42501) at ``Projection.apply``; now
    ``permission_denied`` from ``Projection.prepare``, as ``fencepost.open`` names a role without
    the rights it needs, with the password masked. Nothing is written."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    source = f"sqlite:///{tmp_path / 'flows.db'}"
    admin_url = private_server.url.split("?")[0]
    target = f"{admin_url}?schema=read_model"
    with fencepost.open(source) as store:
        _built_target(store, target)
    admin = create_engine(admin_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql("CREATE ROLE reader LOGIN PASSWORD 'reader-secret'")
        conn.exec_driver_sql("GRANT USAGE ON SCHEMA read_model TO reader")
        conn.exec_driver_sql("GRANT SELECT ON ALL TABLES IN SCHEMA read_model TO reader")
        before = conn.exec_driver_sql("SELECT count(*) FROM read_model.projection_runs_by_status").scalar()
    rest = admin_url.split("://", 1)[1].split("@", 1)[1]
    reader = f"postgresql+psycopg://reader:reader-secret@{rest}?schema=read_model"
    code, text, db_code, _transient = _catch_up_error(source, reader)
    assert (code, db_code) == ("permission_denied", "42501"), text
    assert text.startswith("permission_denied: Projection.prepare: projection target: "), text
    assert "reader-secret" not in text
    with admin.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM read_model.projection_runs_by_status").scalar() == before
    admin.dispose()
