"""The change feed's statements, built once as Core objects (SQLAlchemy caches their compilation)."""

from __future__ import annotations

from sqlalchemy import and_, bindparam, or_, select, update

from fencepost._schema import flows_run_changes, flows_run_source, flows_runs

runs = flows_runs.c
changes = flows_run_changes.c

POSITION = select(flows_run_source.c.source, flows_run_source.c.revision).where(
    flows_run_source.c.singleton == 1
)

# Bounded by the watermark read in the same snapshot: nothing committed later can show up
# inside a range already handed out (REFERENCE 4, "why no change is missed").
CHANGES_SINCE = (
    select(changes.run_id, changes.revision, changes.deleted)
    .where(changes.revision > bindparam("after"), changes.revision <= bindparam("watermark"))
    .order_by(changes.revision)
    .limit(bindparam("n"))
)

ROTATE = (
    update(flows_run_source)
    .where(flows_run_source.c.singleton == 1)
    .values(source=bindparam("new_source"))
    .returning(flows_run_source.c.source, flows_run_source.c.revision)
)

RUN_COLUMNS = (
    runs.run_id,
    runs.status,
    runs.state_json,
    runs.created_at_ms,
    runs.started_at_ms,
    runs.finished_at_ms,
    runs.heartbeat_at_ms,
    runs.owner_host_id,
    runs.owner_pid,
    runs.owner_nonce,
    runs.cancel_requested_at_ms,
    runs.cancel_acknowledgement_json,
    runs.parent_run_id,
    runs.lineage_id,
    runs.round_ordinal,
    runs.waiting_reason,
    runs.waiting_token,
    runs.waiting_wake_at_ms,
    runs.waiting_request,
)

# Runs with their change rows (outer join: a run without one is a corrupt store, reported as such).
READ_RUNS = (
    select(*RUN_COLUMNS, changes.revision.label("change_revision"), changes.deleted.label("change_deleted"))
    .select_from(flows_runs.outerjoin(flows_run_changes, changes.run_id == runs.run_id))
    .where(runs.run_id.in_(bindparam("ids", expanding=True)))
)

READ_TOMBSTONES = select(changes.run_id, changes.revision, changes.deleted).where(
    changes.run_id.in_(bindparam("ids", expanding=True))
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
