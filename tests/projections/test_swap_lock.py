"""A rebuild's swap keeps readers of the projection waiting only for the renames, not for moving rows.

Defect: on PostgreSQL the swap transaction renamed the live and shadow tables first (each rename
takes an ACCESS EXCLUSIVE lock on the table, held to the commit), then, still in that transaction,
copied the held revisions from the shadow's table (delete + insert of one row per run) and emptied
the old rows out of the shadow. Every reader of the live table waited for all of it: about 1.05 s
for a projection of 100,000 runs (a reader polling one row every 2 ms), ten times that at a million.

Checked without a clock: at each statement of the rebuild that moves rows (DELETE, INSERT from a
SELECT, CREATE INDEX), another connection looks in ``pg_locks`` for an ACCESS EXCLUSIVE lock the
builder's session holds on a projection table. SQLite readers never wait for a writer (they read
their snapshot from the write-ahead log), so the lock question is PostgreSQL's; the window it opens
(old rows left in the shadow when the builder dies right after the swap commits) is tested on both.
"""

from __future__ import annotations

import signal

import psycopg
import pytest
from sqlalchemy import event, text

from fencepost.projections import ProjectionBuilder, RunsByStatus
from tests.conftest import require_postgres
from tests.projections import _runs
from tests.projections.conftest import spawn_child, why

LIVE = "projection_runs_by_status"
TABLES = (LIVE, f"{LIVE}__shadow", "projection_run_revisions", "projection_run_revisions_shadow")
MOVES_ROWS = ("DELETE", "CREATE INDEX")


def _seed(store, prefix: str, n: int, t: int = 0) -> None:
    store.db.write(lambda conn: [_runs.create(conn, f"{prefix}-{i}", t + i) for i in range(n)])


def _moves_rows(statement: str) -> bool:
    s = " ".join(statement.split()).upper()
    return s.startswith(MOVES_ROWS) or (s.startswith("INSERT") and " SELECT " in s)


def _plain_dsn(url: str) -> tuple[str, str]:
    """The libpq DSN of the test server and the schema of a test URL (``...?schema=S``)."""
    from sqlalchemy.engine import make_url

    dsn = make_url(require_postgres()).set(drivername="postgresql").render_as_string(hide_password=False)
    return dsn, url.rsplit("schema=", 1)[1]


def test_rows_move_before_the_tables_are_locked_by_the_renames(store, make_db_url):
    """The swap renames (the builder's session then locks the projection's tables out) only after
    every row it moves has moved: readers wait for the renames and the commit, nothing else."""
    target_url = make_db_url("postgresql")
    _seed(store, "old", 30)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=10) as builder:
        builder.catch_up()
        store.feed.rotate_source()
        _seed(store, "new", 20, 100)
        # Renames are safe unless a session anywhere on the server holds an old snapshot (another
        # test's, on a shared server); nobody reads this target, so let the swap rename.
        builder.target.backend.renames_safe_after = lambda conn, marker: True
        dsn, schema = _plain_dsn(target_url)
        watcher = psycopg.connect(dsn, autocommit=True)
        held_while_moving: list[tuple[str, list[str]]] = []
        renames: list[str] = []

        def look(conn, _cursor, statement, *_args) -> None:
            if statement.lstrip().upper().startswith("ALTER TABLE") and "RENAME" in statement.upper():
                renames.append(statement)
            if not _moves_rows(statement):
                return
            pid = conn.connection.dbapi_connection.info.backend_pid
            locked = [r[0] for r in watcher.execute(
                "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE l.pid = %s AND l.granted AND l.mode = 'AccessExclusiveLock' AND n.nspname = %s",
                (pid, schema)).fetchall() if r[0] in TABLES]
            if locked:
                held_while_moving.append((" ".join(statement.split())[:120], sorted(locked)))

        event.listen(builder.target.engine, "before_cursor_execute", look)
        try:
            assert builder.catch_up().rebuilt
        finally:
            event.remove(builder.target.engine, "before_cursor_execute", look)
            watcher.close()
        assert len(renames) == 3, renames  # it did swap by renaming (the case that locks)
        assert held_while_moving == []
        assert builder.target.read(_runs.projected_rows_fn(LIVE)) == store.db.read(_runs.live_rows)
        assert builder.target.read(
            lambda conn: conn.execute(text(f"SELECT COUNT(*) FROM {LIVE}__shadow")).scalar()) == 0


@pytest.mark.usefixtures("no_child_outlives_its_test")
def test_a_builder_killed_after_the_swap_commits_leaves_only_old_shadow_rows(store, db_url, target_url):
    """Killed between the swap's commit and the emptying of the shadow: the projection and its held
    revisions are the new ones; the old rows still in the shadow are emptied by the next rebuild."""
    if target_url.startswith("postgresql"):
        require_postgres()
    _seed(store, "old", 12)
    child = spawn_child("tests.projections._swap_cleanup_kill_child", db_url, target_url)
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == "swapped", why(child)
    child.send_signal(signal.SIGKILL)
    child.wait()
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=5) as builder:
        shadow_rows = builder.target.read(
            lambda conn: conn.execute(text(f"SELECT COUNT(*) FROM {LIVE}__shadow")).scalar())
        assert shadow_rows == 12  # the old projection: the window was hit
        assert builder.target.read(_runs.projected_rows_fn(LIVE)) == store.db.read(_runs.live_rows)
        _seed(store, "later", 4, 1000)
        result = builder.catch_up()
        assert not result.rebuilt and result.applied == 4  # the swapped-in held revisions serve as before
        assert builder.target.read(_runs.projected_rows_fn(LIVE)) == store.db.read(_runs.live_rows)
        assert builder.rebuild().rebuilt
        assert builder.target.read(_runs.projected_rows_fn(LIVE)) == store.db.read(_runs.live_rows)
        assert builder.target.read(
            lambda conn: conn.execute(text(f"SELECT COUNT(*) FROM {LIVE}__shadow")).scalar()) == 0


def test_the_emptying_after_a_swap_leaves_a_rebuild_begun_since_alone(store, target_url):
    """The post-swap emptying is a write of its own: by the time it runs, another rebuild may have
    begun and committed shadow pages (another builder that took the name once this one's lock was
    lost). Deleting them then would make that rebuild, resumed from its shadow checkpoint, swap in a
    projection missing the runs of those pages; a reviewer's simulation lost 5 of 12. The emptying
    now first looks at the checkpoint and leaves a shadow that a rebuild has begun alone."""
    if target_url.startswith("postgresql"):
        require_postgres()
    _seed(store, "old", 12)
    with ProjectionBuilder(store, target_url, RunsByStatus(), batch_size=5) as builder:
        builder.catch_up()

        class Stop(Exception):
            pass

        def stop_after_a_shadow_page(shadow: bool, _page) -> None:
            if shadow:
                raise Stop

        builder._after_page = stop_after_a_shadow_page
        with pytest.raises(Stop):
            builder.rebuild()  # begun, one shadow page committed, then stopped
        builder._after_page = None
        shadow_rows = lambda: builder.target.read(  # noqa: E731
            lambda conn: conn.execute(text(f"SELECT COUNT(*) FROM {LIVE}__shadow")).scalar())
        assert shadow_rows() == 5
        builder._empty_shadow(builder._shares[0])  # an earlier swap's emptying, arriving late
        assert shadow_rows() == 5
        assert builder.catch_up().rebuilt  # the begun rebuild resumes from its shadow checkpoint
        assert builder.target.read(_runs.projected_rows_fn(LIVE)) == store.db.read(_runs.live_rows)
        assert shadow_rows() == 0
