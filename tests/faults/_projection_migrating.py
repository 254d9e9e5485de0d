"""A projection builder in a process of its own opening a target that lacks migration 3005 (for
``test_projection_migration_3005``).

Usage: python -m tests.faults._projection_migrating SOURCE_URL TARGET_URL PROJECTION [PAUSE [CACHE_PAGES]]

``PROJECTION`` is ``runs_by_status`` or ``ownership_history``. The builder catches up once; on the way:

- ``pending <ids>``: its migration pass read the target's ledger (outside the write lock) and found
  these migrations missing;
- ``paused <backend pid or 0>``: the first statement of the pass holding ``PAUSE`` ran
  (inside the pass's one write transaction, not committed); then it waits for a line on stdin (or
  to be killed);
- ``migrated <ids>``: what its pass applied (``-`` for none);
- ``caught_up <applied> <rejected> <rebuilt> <revision>`` once ``catch_up`` returned, or
  ``failed <code>`` for a ``ProjectionError``.

``CACHE_PAGES`` (SQLite) makes every connection's page cache that small, so the pass's uncommitted
pages spill into the log file before the pause.
"""

from __future__ import annotations

import sys

from sqlalchemy import event
from sqlalchemy.engine import Engine

import fencepost
from fencepost import _migrations
from fencepost.projections import OwnershipHistory, ProjectionBuilder, RunsByStatus
from fencepost.projections import builder as builder_module


def _ids(ids) -> str:
    return " ".join(str(i) for i in ids) or "-"


def main(source_url: str, target_url: str, projection: str, pause: str | None, cache_pages: int | None) -> None:
    backend_pid = [0]
    paused = [False]

    if cache_pages is not None:
        @event.listens_for(Engine, "connect")
        def small_cache(dbapi_conn, record) -> None:
            if type(dbapi_conn).__module__.startswith("sqlite3"):
                dbapi_conn.execute(f"PRAGMA cache_size = {cache_pages}")

    @event.listens_for(Engine, "after_cursor_execute")
    def maybe_pause(conn, cursor, statement, params, context, executemany) -> None:
        info = getattr(cursor.connection, "info", None)
        backend_pid[0] = int(getattr(info, "backend_pid", 0) or 0)
        if pause and not paused[0] and pause in statement:
            paused[0] = True
            print(f"paused {backend_pid[0]}", flush=True)
            sys.stdin.readline()

    real_pending, real_migrate = _migrations.pending, builder_module.migrate

    def pending(db, namespaces=_migrations.STORE_NAMESPACES):
        todo = real_pending(db, namespaces)
        if namespaces == ("projections",):
            print(f"pending {_ids(m.id for m in todo)}", flush=True)
        return todo

    def migrate(db, namespaces=_migrations.STORE_NAMESPACES, **how):
        done = real_migrate(db, namespaces, **how)
        if namespaces == ("projections",):
            print(f"migrated {_ids(done)}", flush=True)
        return done

    _migrations.pending = pending
    builder_module.migrate = migrate
    made = {"runs_by_status": RunsByStatus, "ownership_history": OwnershipHistory}[projection]
    with fencepost.open(source_url) as store, \
            ProjectionBuilder(store, target_url, made(), batch_size=250, lock_timeout=30) as builder:
        try:
            done = builder.catch_up()
        except fencepost.ProjectionError as exc:
            print(f"failed {exc.code}", flush=True)
            return
        print(f"caught_up {done.applied} {done.rejected} {done.rebuilt} {done.revision}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], args[2], args[3] if len(args) > 3 and args[3] else None,
         int(args[4]) if len(args) > 4 else None)
