"""A projection builder's error from its target says whether waiting may cure it (``transient``), as
run-store, journal and change-feed errors do.

Defect: a failure met once the target had been reached carried ``transient`` (it went through the
store's mapping), but a target failing at the builder's first contact did not carry it at all: a
server not accepting connections (``cannot_connect``, which waiting cures), a database that is not
there (``database_missing``), a SQLite file that cannot be created (``permission_denied``). A caller
retrying on ``transient`` met an ``AttributeError`` or had to guess from the code. Outages are real:
another connection holding the target's write lock past the wait (SQLite's ``busy_timeout_ms``,
PostgreSQL's ``lock_timeout``), a port where no server listens, a database that is not there, a
file of garbage.
"""

from __future__ import annotations

import socket

import pytest

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.worker.test_outage_in_run import LockHolder, _short_wait


def _raises(call) -> ProjectionError:
    with pytest.raises(ProjectionError) as caught:
        call()
    return caught.value


@pytest.fixture
def locked_target(store, backend: str, make_db_url):
    """``(target url with a 100 ms lock wait, holder of the target's write lock)``, built once."""
    url = make_db_url()
    store.runs.create("r1", "{}")
    with ProjectionBuilder(store, url, RunsByStatus()) as first:
        first.catch_up()
    store.runs.create("r2", "{}")
    holder = LockHolder(url, backend)
    try:
        yield _short_wait(url, backend), holder
    finally:
        holder.close()


def test_a_target_whose_write_lock_is_held_fails_transient_then_the_same_builder_works(store, locked_target):
    url, holder = locked_target
    with ProjectionBuilder(store, url, RunsByStatus()) as builder:
        holder.hold()
        for call in (builder.catch_up, builder.rebuild, lambda: builder.offer(store.feed.read(["r1"]))):
            err = _raises(call)
            assert (err.code, err.transient) == ("persistence_failed", True), err  # type: ignore[attr-defined]
        holder.free()
        assert builder.catch_up().revision == 2


def test_a_new_target_whose_write_lock_is_held_at_the_first_call_fails_transient(store, backend, make_db_url):
    """The first call connects (SQLite: switching a new file to WAL needs the lock) and creates the
    builder's tables: it waits for the lock too. On SQLite this was ``open_failed`` without ``transient``."""
    url = make_db_url()
    store.runs.create("r1", "{}")
    if backend == "postgresql":
        with ProjectionBuilder(store, url, RunsByStatus()) as first:  # the schema; the holder needs it
            first.status()
    holder = LockHolder(url, backend)
    try:
        holder.hold()
        with ProjectionBuilder(store, _short_wait(url, backend), RunsByStatus()) as builder:
            err = _raises(builder.catch_up)
            # SQLite: met connecting (open_failed, saying why); PostgreSQL: creating the tables.
            assert err.code == ("open_failed" if backend == "sqlite" else "persistence_failed"), err
            assert getattr(err, "transient", None) is True and "write lock" in str(err), err
            holder.free()
            assert builder.catch_up().applied == 1
    finally:
        holder.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_target_server_that_is_not_accepting_is_cannot_connect_and_transient(store):
    """PostgreSQL only: a SQLite target has no server to be down."""
    url = f"postgresql+psycopg://postgres@127.0.0.1:{_free_port()}/test?connect_timeout=2"
    with ProjectionBuilder(store, url, RunsByStatus()) as builder:
        for call in (builder.catch_up, builder.status):
            err = _raises(call)
            assert (err.code, getattr(err, "transient", None)) == ("cannot_connect", True), err


def test_a_target_that_cannot_be_there_is_refused_and_not_transient(store, backend, db_url, tmp_path):
    """Waiting cures neither a PostgreSQL database that does not exist nor a SQLite target file
    that is not a database."""
    if backend == "postgresql":
        base = db_url.split("?", 1)[0]
        url, code = base.rsplit("/", 1)[0] + "/fencepost_no_such_database", "database_missing"
    else:
        (tmp_path / "projection.db").write_bytes(b"not a database, " * 512)
        url, code = f"sqlite:///{tmp_path / 'projection.db'}", "not_a_database"
    with ProjectionBuilder(store, url, RunsByStatus()) as builder:
        err = _raises(builder.catch_up)
        assert (err.code, getattr(err, "transient", None)) == (code, False), err
