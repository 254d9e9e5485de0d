"""A projection target that fails under a builder after its first call: the PostgreSQL server
stopped (a private ``initdb`` instance, ``pg_ctl``, never the shared one), or the SQLite target's
file system remounted read-only (a tmpfs).

The next call fails as a ``ProjectionError`` naming nothing but the target (it was the driver's own
exception quoting the server's address, or a bare ``OSError``), applies nothing, and once the fault
is gone the same builder catches up.
"""

from __future__ import annotations

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
