"""The change feed's statements, built once as Core objects.

The per-page ones (position, a page of changes, a page with its snapshots) are compiled once per
dialect and run on the driver cursor, like the run store's hot path; the rest go through SQLAlchemy.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import LargeBinary, and_, bindparam, cast, func, or_, select, true, update

from fencepost._schema import flows_run_changes, flows_run_source, flows_runs
from fencepost._statements import PerDialect, Sql
from fencepost.runstore._sql import RUN_COLUMNS as STORED_RUN_COLUMNS

runs = flows_runs.c
changes = flows_run_changes.c

POSITION = Sql(select(flows_run_source.c.source, flows_run_source.c.revision).where(
    flows_run_source.c.singleton == 1
))

# Bounded by the watermark read in the same snapshot: nothing committed later can show up
# inside a range already handed out (REFERENCE 4, "why no change is missed").
#
# PostgreSQL is sent the page as the first ``n`` changes after the position (in the revision
# index's order, cut by the LIMIT), then cut at the watermark outside that subquery, which is the
# same page: the changes are in revision order, so those up to the watermark are a prefix. Written
# with both bounds in one range, a table without statistics (freshly loaded, restored, or written
# faster than autovacuum analyses it) had the planner guess the range's size and scan and sort the
# whole change table for every page. A LIMIT in a subquery also keeps the outer bound from being
# pushed back into it.
_NEXT_CHANGES = (
    select(changes.run_id, changes.revision, changes.deleted)
    .where(changes.revision > bindparam("after"))
    .order_by(changes.revision)
    .limit(bindparam("n"))
    .subquery("c")
)
CHANGES_SINCE = PerDialect.on_postgres(
    select(changes.run_id, changes.revision, changes.deleted)
    .where(changes.revision > bindparam("after"), changes.revision <= bindparam("watermark"))
    .order_by(changes.revision)
    .limit(bindparam("n")),
    select(_NEXT_CHANGES.c.run_id, _NEXT_CHANGES.c.revision, _NEXT_CHANGES.c.deleted)
    .where(_NEXT_CHANGES.c.revision <= bindparam("watermark"))
    .order_by(_NEXT_CHANGES.c.revision),
)

ROTATE = (
    update(flows_run_source)
    .where(flows_run_source.c.singleton == 1)
    .values(source=bindparam("new_source"))
    .returning(flows_run_source.c.source, flows_run_source.c.revision)
)

# The run store's own columns first (decoded by its decoder), then what only the feed reads.
RUN_COLUMNS = (
    *STORED_RUN_COLUMNS,
    runs.waiting_reason,
    runs.waiting_token,
    runs.waiting_wake_at_ms,
    runs.waiting_request,
)

_read_cache: dict[str, tuple[Any, Any]] = {}


def read_statements(backend: Any) -> tuple[Any, Any]:
    """``(runs with their change rows, change rows)`` for the ids bound as ``ids``, per backend.

    The outer join keeps a run without a change row visible, so a corrupt store is reported as such.
    """
    cached = _read_cache.get(backend.name)
    if cached is None:
        runs_stmt = (
            select(*RUN_COLUMNS, changes.revision.label("change_revision"), changes.deleted.label("change_deleted"))
            .select_from(flows_runs.outerjoin(flows_run_changes, changes.run_id == runs.run_id))
            .where(backend.any_of(runs.run_id, "ids"))
        )
        tomb_stmt = select(changes.run_id, changes.revision, changes.deleted).where(
            backend.any_of(changes.run_id, "ids")
        )
        cached = _read_cache[backend.name] = (runs_stmt, tomb_stmt)
    return cached


# One page of changes with the run row of each (NULL for a tombstone), in revision order: the
# snapshots of a page in the same statement as the page (columns as ``decode_run`` reads them,
# then the change's own run id).
#
# PostgreSQL: the page of changes as ``CHANGES_SINCE`` has it, and each change's run row looked up
# by its key (a LATERAL subquery with a LIMIT, which the planner cannot turn into a join of the
# two tables). As one join, a table without statistics had the planner hash the whole runs table
# for every page, however few changes the page held.
_RUN_OF_CHANGE = select(*RUN_COLUMNS).where(runs.run_id == _NEXT_CHANGES.c.run_id).limit(1).lateral("r")
CHANGES_WITH_RUNS = PerDialect.on_postgres(
    select(*RUN_COLUMNS, changes.revision, changes.deleted, changes.run_id.label("change_run_id"))
    .select_from(flows_run_changes.outerjoin(flows_runs, runs.run_id == changes.run_id))
    .where(changes.revision > bindparam("after"), changes.revision <= bindparam("watermark"))
    .order_by(changes.revision)
    .limit(bindparam("n")),
    select(*(_RUN_OF_CHANGE.c[c.name] for c in RUN_COLUMNS), _NEXT_CHANGES.c.revision, _NEXT_CHANGES.c.deleted,
           _NEXT_CHANGES.c.run_id.label("change_run_id"))
    .select_from(_NEXT_CHANGES.outerjoin(_RUN_OF_CHANGE, true()))
    .where(_NEXT_CHANGES.c.revision <= bindparam("watermark"))
    .order_by(_NEXT_CHANGES.c.revision),
)

# SQLite: the same page as ONE value, the JSON array of its rows (``json_array`` of the columns
# above, in the page's revision order), so the driver hands over one bytes object instead of a
# Python tuple of 27 objects per row. Sent as a BLOB: the text is decoded (and its UTF-8 checked)
# by the JSON decoder, once. See ``feed._page_rows``: what it cannot represent exactly goes back to
# the row statement.
_page = CHANGES_WITH_RUNS.stmt.subquery("page")
CHANGES_WITH_RUNS_JSON = Sql(
    select(cast(func.json_group_array(func.json_array(*_page.c)), LargeBinary)).select_from(_page)
)

LIST_BASE = select(
    *RUN_COLUMNS, changes.revision.label("change_revision"), changes.deleted.label("change_deleted")
).select_from(flows_runs.outerjoin(flows_run_changes, changes.run_id == runs.run_id))


def after_key():
    """Keyset predicate ``(created_at_ms, run_id) > (:after_created, :after_run)``.

    Spelled with a leading ``created_at_ms >=`` so both planners use the listing index as a range.
    """
    created = bindparam("after_created")
    return and_(
        runs.created_at_ms >= created,
        or_(runs.created_at_ms > created, runs.run_id > bindparam("after_run")),
    )


def before_key():
    """Keyset predicate ``(created_at_ms, run_id) < (:after_created, :after_run)`` (newest-first pages)."""
    created = bindparam("after_created")
    return and_(
        runs.created_at_ms <= created,
        or_(runs.created_at_ms < created, runs.run_id < bindparam("after_run")),
    )
