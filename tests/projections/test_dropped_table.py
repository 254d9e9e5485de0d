"""A projection table dropped on the target is built again, never left empty behind a caught-up checkpoint.

Defect: dropping a projection's table (a common way to start a read model over) left its checkpoint
as it was. The next builder recreated the table empty and reported lag 0 for ever: every run was
missing from the read model and nothing said so. A builder following in ``run()`` when the table was
dropped failed each page with ``persistence_failed`` and retried for ever. A dropped shadow table was
recreated empty while the shadow checkpoint kept its position, so the rebuild resumed and swapped in
a read model without the rows of its earlier pages. Now a builder that finds a live table missing
builds the projection again from revision 0 (its remaining tables emptied, its held revisions
forgotten), and a missing shadow table restarts the shadow fill.
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import event, text

from fencepost.errors import ProjectionError
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections import _runs
from tests.projections._following import Following

TABLE = "projection_runs_by_status"


def _seed(store, n: int, prefix: str = "run") -> None:
    store.db.write(lambda conn: [_runs.create(conn, f"{prefix}-{i}", i) for i in range(n)])


def _drop(builder: ProjectionBuilder, table: str) -> None:
    builder.target.write(lambda conn: conn.execute(text(f"DROP TABLE {table}")))


def test_a_dropped_projection_table_is_built_again_from_the_start(store, target_url):
    _seed(store, 6)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=4) as builder:
        builder.catch_up()
        _drop(builder, TABLE)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=4) as builder:
        done = builder.catch_up()
        assert done.applied == 6 and done.revision == 6
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)
        status = builder.status()
        assert (status.lag, status.applied_revision) == (0, 6)


def test_a_table_dropped_while_the_builder_follows_is_built_again(store, target_url):
    _seed(store, 3)
    with ProjectionBuilder(store, target_url, RunsByStatus(), poll_interval=0.1) as builder:
        with Following(builder) as following:
            assert following.wait(lambda: not builder.status().lag)
            _drop(builder, TABLE)
            _seed(store, 2, "after")
            want = store.db.read(_runs.live_rows)

            def projected() -> dict | None:
                try:
                    return builder.target.read(_runs.projected_rows)
                except Exception:  # the table is missing until the builder recreates it
                    return None

            assert following.wait(lambda: projected() == want) and not following.failure
    assert not following.failure


def test_a_shadow_table_dropped_mid_rebuild_restarts_the_fill(store, target_url):
    _seed(store, 9)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        builder.catch_up()
        pages = []

        def interrupt(shadow: bool, page) -> None:
            pages.append(page)
            if shadow and len(pages) == 2:
                raise KeyboardInterrupt  # a crash after the second shadow page committed

        builder._after_page = interrupt
        try:
            builder.rebuild()
        except KeyboardInterrupt:
            pass
        _drop(builder, f"{TABLE}__shadow")
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=3) as builder:
        assert builder.catch_up().rebuilt
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)


def test_the_same_builder_notices_a_dropped_table_at_its_next_catch_up(store, target_url):
    """Defect: a builder that had caught up kept believing its tables were there. With no new
    change to write, ``catch_up()`` after the live table was dropped returned ``applied=0`` and the
    read model stayed missing (reads failed) until some later change made a write fail."""
    _seed(store, 6)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=4) as builder:
        builder.catch_up()
        builder.rebuild()  # an odd number of swaps: the live table carries what the shadow was
        _drop(builder, TABLE)
        done = builder.catch_up()
        assert (done.applied, done.revision) == (6, 6)
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)
        assert builder.status().lag == 0
        _drop(builder, f"{TABLE}__shadow")  # the shadow is recreated too, and rebuilds keep working
        assert builder.catch_up().applied == 0
        assert builder.rebuild().rebuilt
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)


def test_a_rebuild_on_the_same_builder_after_a_drop_recreates_the_table(store, target_url):
    _seed(store, 5)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=4) as builder:
        builder.catch_up()
        _drop(builder, TABLE)
        assert builder.rebuild().rebuilt
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)


def test_status_shows_a_dropped_table_as_pending_until_a_builder_builds_it(store, target_url):
    """Defect: after the live table was dropped, ``status()`` (and ``fencepost projection status``)
    still said caught up (lag 0, nothing pending) while the read model was gone."""
    _seed(store, 4)
    with ProjectionBuilder(store, target_url, RunsByStatus()) as builder:
        builder.catch_up()
        _drop(builder, TABLE)
        status = builder.status()
        assert (status.pending_rebuild, status.lag) == ("table_missing", 4)
        builder.catch_up()
        status = builder.status()
        assert (status.pending_rebuild, status.lag) == (None, 0)


def _catalog_statements(builder: ProjectionBuilder):
    """A list that fills with every catalog lookup of table existence the builder sends to its target."""
    seen: list[str] = []

    def on_before(_conn, _cursor, statement, parameters, _context, _many):
        if "sqlite_master" in statement or "pg_tables" in statement:
            seen.append(statement)
        return statement, parameters

    event.listen(builder.target.engine, "before_cursor_execute", on_before, retval=True)
    return seen, lambda: event.remove(builder.target.engine, "before_cursor_execute", on_before)


def test_each_call_looks_for_the_projections_tables_with_one_catalog_query(store, target_url):
    """Defect: every ``catch_up``, ``offer`` and pass of ``run`` looked each table of the projection
    (live and shadow) up in the catalog with a statement of its own: two round trips for a
    one-table projection, more for each table it declares, before anything was applied. Now one
    query lists which of them exist, and a dropped table is still noticed by it."""
    _seed(store, 3)
    with ProjectionBuilder(store, target_url, RunsByStatus(), poll_interval=0.05) as builder:
        builder.catch_up()
        seen, stop_counting = _catalog_statements(builder)
        try:
            builder.catch_up()
            assert len(seen) == 1, seen
            builder.offer(store.feed.read(["run-0"]))
            assert len(seen) == 2, seen
            passes = []
            prepare = builder._prepare

            def counted() -> None:
                passes.append(1)
                prepare()

            builder._prepare = counted  # type: ignore[method-assign]
            stop = threading.Event()
            runner = threading.Thread(target=builder.run, args=(stop,))
            runner.start()
            try:
                deadline = time.monotonic() + 20
                while len(passes) < 4 and time.monotonic() < deadline:
                    stop.wait(0.02)
            finally:
                stop.set()
                runner.join(timeout=20)
            assert len(passes) >= 4 and len(seen) == 2 + len(passes), (len(passes), seen)
        finally:
            stop_counting()
        _drop(builder, TABLE)
        assert builder.status().pending_rebuild == "table_missing"
        assert builder.catch_up().applied == 3
        assert builder.target.read(_runs.projected_rows) == store.db.read(_runs.live_rows)


def _catch_up_dropping(builder: ProjectionBuilder, table: str) -> ProjectionError:
    """``catch_up`` with ``table`` dropped on the target before its first page is applied: the error."""
    def drop_first(revision: int, head: int) -> None:
        if not dropped:
            dropped.append(revision)
            _drop(builder, table)

    dropped: list[int] = []
    try:
        builder.catch_up(on_progress=drop_first)
    except ProjectionError as exc:
        return exc
    raise AssertionError("the catch-up did not fail")


def test_a_table_dropped_during_a_catch_up_is_named_as_the_projections_own(store, target_url):
    """The error for the projection's own table dropped under a catch-up said "a table or column
    fencepost needs is missing; fencepost migrations status shows what the database records", but
    migrations never create a projection's tables (and ``migrations status`` shows nothing wrong):
    the builder does. Now it names the table and says the next catch-up or run builds it again,
    which the next call does."""
    _seed(store, 3)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=2) as builder:
        builder.catch_up()
        _seed(store, 2, "after")
        err = _catch_up_dropping(builder, TABLE)
        again = builder.catch_up()
        rows = builder.target.read(_runs.projected_rows)
    assert err.code == "persistence_failed"
    assert "migrations status" not in str(err), str(err)
    assert f"table {TABLE} of projection runs_by_status is missing" in err.detail, err.detail
    assert "builds the projection again at its next catch-up or run" in err.detail
    assert again.applied == 5 and rows == store.db.read(_runs.live_rows)


def test_a_fencepost_table_dropped_during_a_catch_up_still_points_at_migrations_status(store, target_url):
    """A table migrations create on the target (the projections' checkpoints) keeps the store's
    words: it is missing, and ``migrations status`` shows what the database records."""
    _seed(store, 3)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=2) as builder:
        err = _catch_up_dropping(builder, "projection_checkpoints")
    assert "a table or column fencepost needs is missing" in err.detail, err.detail
    assert "migrations status" in err.detail and "of projection" not in err.detail
