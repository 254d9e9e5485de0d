"""``offer`` after the source was restored or rotated says so (``SourceChanged``): rebuild.

Defect: a target built from a source that was then restored from an older copy keeping its source
id (its head is now behind the projection's checkpoint) refused a snapshot read before the restore
as ``invalid_projection: ... not a snapshot the feed gave``, as if it had been forged; and a
snapshot of the restored copy was compared with revisions of the lost history. Now ``offer`` raises
``SourceChanged`` (as the feed does for a position of a restored or rotated source, and as
``catch_up`` treats a checkpoint ahead of its source: rebuild), writing nothing; a snapshot ahead of
a source that was not restored is still refused as forged. Both backends (the PostgreSQL restore is
made with raw SQL, as in the change-feed tests: restoring a schema on the shared server is out of
reach of a test).
"""

from __future__ import annotations

import sqlite3

import msgspec
import pytest
from sqlalchemy import text

from fencepost.errors import ProjectionError, SourceChanged
from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.projections import _runs


def _restore_older_copy(store, backend: str, tmp_path, write_more) -> None:
    """Back the source up, ``write_more()`` (creates ``later-*`` runs only), put the copy back."""
    if backend == "sqlite":
        backup = sqlite3.connect(str(tmp_path / "backup.db"))
        live = sqlite3.connect(str(store.db.path))
        live.backup(backup)
        write_more()
        backup.backup(live)  # the older copy, same source id, lower revision
        live.close()
        backup.close()
        return
    revision = store.feed.position().revision
    write_more()

    def rewind(conn) -> None:
        conn.execute(text("DELETE FROM flows_runs WHERE run_id LIKE 'later-%'"))
        conn.execute(text("DELETE FROM flows_run_changes WHERE run_id LIKE 'later-%'"))
        conn.execute(text("UPDATE flows_run_source SET revision = :r"), {"r": revision})

    store.db.write(rewind)


def _projected(builder: ProjectionBuilder) -> dict:
    return builder.target.read(_runs.projected_rows_fn("projection_runs_by_status"))


def _counts(builder: ProjectionBuilder) -> tuple:
    status = builder.status()
    return status.applied, status.rejected, status.applied_revision, status.rebuilds


def test_offer_after_the_source_was_restored_raises_source_changed_and_writes_nothing(
        store, backend, tmp_path, make_db_url):
    store.db.write(lambda conn: (_runs.create(conn, "kept-1", 0), _runs.create(conn, "kept-2", 1)))
    taken = []
    with ProjectionBuilder(store, make_db_url(), RunsByStatus()) as builder:
        def write_more() -> None:
            store.db.write(lambda conn: _runs.create(conn, "later-1", 2))
            builder.catch_up()
            taken.append(store.feed.read(["later-1"]).snapshots[0])

        _restore_older_copy(store, backend, tmp_path, write_more)
        head = store.feed.position().revision
        assert taken[0].revision > head
        assert builder.status().pending_rebuild == "source_rewound"
        before, rows = _counts(builder), _projected(builder)

        # Read before the restore (ahead of the restored head), or from the restored copy: either
        # way the projection reflects a history the source no longer has.
        for offered in ([taken[0]], store.feed.read(["kept-1"])):
            with pytest.raises(SourceChanged) as caught:
                builder.offer(offered)
            assert caught.value.method == "offer" and caught.value.rotated is False
            assert "rebuild" in caught.value.detail and "not a snapshot the feed gave" not in caught.value.detail
            assert (_counts(builder), _projected(builder)) == (before, rows)

        result = builder.catch_up()
        assert result.rebuilt and result.revision == head
        assert _projected(builder) == store.db.read(_runs.live_rows)
        assert builder.offer(store.feed.read(["kept-1"])).rejected == 1  # compared again: not newer

        # The source was not restored since: a snapshot ahead of its head is still refused as forged.
        after = _counts(builder)
        forged = msgspec.structs.replace(store.feed.read(["kept-1"]).snapshots[0], status="failed",
                                         revision=head + 1)
        with pytest.raises(ProjectionError) as refused:
            builder.offer([forged])
        assert refused.value.code == "invalid_projection" and "ahead" in refused.value.detail
        assert (_counts(builder), _projected(builder)) == (after, store.db.read(_runs.live_rows))


def test_offer_after_the_source_was_rotated_raises_source_changed_and_writes_nothing(store, make_db_url):
    store.db.write(lambda conn: _runs.create(conn, "r-1", 0))
    with ProjectionBuilder(store, make_db_url(), RunsByStatus()) as builder:
        builder.catch_up()
        store.db.write(lambda conn: _runs.start(conn, "r-1", 1))
        old = store.feed.read(["r-1"]).snapshots[0]  # newer than what is held, of the old source
        store.feed.rotate_source()
        before, rows = _counts(builder), _projected(builder)
        for offered in ([old], store.feed.read(["r-1"])):
            with pytest.raises(SourceChanged) as caught:
                builder.offer(offered)
            assert caught.value.method == "offer" and caught.value.rotated is True
            assert (_counts(builder), _projected(builder)) == (before, rows)
        assert builder.catch_up().rebuilt
        assert _projected(builder) == store.db.read(_runs.live_rows)
