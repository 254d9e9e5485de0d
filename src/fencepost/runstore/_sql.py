"""The run store's statements, as module-level Core objects compiled once per dialect.

The hot path (claim, heartbeat, settle) runs a handful of tiny statements per transaction, where
SQLAlchemy's per-call execution machinery would cost more than SQLite itself. So each statement is
declared once in Core (one definition for both backends) and run by ``fencepost._statements``.

The two constructs that render differently per dialect, ``greatest`` and ``in_json_ids`` (a set of ids
passed as one JSON array parameter, which keeps ``heartbeat_many`` one statement whatever the number
of runs), live in ``fencepost._dialects`` with the rest of the SQLite/PostgreSQL differences.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, ColumnClause, Text, and_, bindparam, exists, func, literal_column, null, or_, select

from fencepost._dialects import greatest, in_json_ids
from fencepost._schema import flows_attempts as at
from fencepost._schema import flows_runs as runs
from fencepost._statements import PerDialect, Sql, run

__all__ = ["PerDialect", "Sql", "run"]  # the executor, used through this module by the run store

def _int(name: str) -> Any:
    return bindparam(name, type_=BigInteger)


def _txt(name: str) -> Any:
    return bindparam(name, type_=Text)


RUNNING: ColumnClause[str] = literal_column("'running'")
_LIVE: ColumnClause[bool] = literal_column("flows_runs.status NOT IN ('completed', 'failed', 'cancelled')")

# --------------------------------------------------------------------------- runs

RUN_COLUMNS = (
    runs.c.run_id, runs.c.status, runs.c.state_json, runs.c.created_at_ms, runs.c.started_at_ms,
    runs.c.finished_at_ms, runs.c.heartbeat_at_ms, runs.c.owner_host_id, runs.c.owner_pid,
    runs.c.owner_nonce, runs.c.claim_host_id, runs.c.claim_pid, runs.c.claim_nonce, runs.c.claimed_at_ms,
    runs.c.cancel_requested_at_ms, runs.c.cancel_acknowledgement_json, runs.c.parent_run_id,
    runs.c.lineage_id, runs.c.round_ordinal, runs.c.failure_json,
)

INSERT_RUN = Sql(
    runs.insert().values(
        run_id=_txt("run_id"), status=literal_column("'pending'"), state_json=_txt("state_json"),
        created_at_ms=_int("now"), parent_run_id=_txt("parent_run_id"), lineage_id=_txt("lineage_id"),
        round_ordinal=_int("round_ordinal"),
    )
)

SELECT_RUN = Sql(select(*RUN_COLUMNS).where(runs.c.run_id == _txt("run_id")))

DELETE_RUN = Sql(runs.delete().where(runs.c.run_id == _txt("run_id")).returning(runs.c.run_id))

DELETE_ATTEMPTS = Sql(at.delete().where(at.c.run_id == _txt("run_id")))

HAS_CHILDREN = Sql(
    select(literal_column("1")).select_from(runs).where(runs.c.parent_run_id == _txt("run_id"))
    .limit(literal_column("1"))
)

# The guarded fields and the claim, read under the writer lock: the row the predicates judge.
SELECT_GUARDED = Sql(
    select(
        runs.c.status, runs.c.owner_host_id, runs.c.owner_pid, runs.c.owner_nonce, runs.c.heartbeat_at_ms,
        runs.c.claim_host_id, runs.c.claim_pid, runs.c.claim_nonce, runs.c.claimed_at_ms,
    ).where(runs.c.run_id == _txt("run_id"))
)

SET_CLAIM = Sql(
    runs.update().where(runs.c.run_id == _txt("run_id")).values(
        claim_host_id=_txt("c_host"), claim_pid=_int("c_pid"), claim_nonce=_txt("c_nonce"),
        claimed_at_ms=_int("claimed_at"),
    )
)

CLEAR_CLAIM = Sql(
    runs.update().where(runs.c.run_id == _txt("run_id")).values(
        claim_host_id=null(), claim_pid=null(), claim_nonce=null(), claimed_at_ms=null(),
    )
)

_token_match = and_(
    runs.c.run_id == _txt("run_id"), runs.c.claim_host_id == _txt("c_host"), runs.c.claim_pid == _int("c_pid"),
    runs.c.claim_nonce == _txt("c_nonce"), runs.c.claimed_at_ms == _int("claimed_at"),
)

CLEAR_CLAIM_IF_TOKEN = Sql(
    runs.update().where(_token_match).values(
        claim_host_id=null(), claim_pid=null(), claim_nonce=null(), claimed_at_ms=null(),
    ).returning(runs.c.run_id)
)

SET_RUNNING = Sql(
    runs.update().where(runs.c.run_id == _txt("run_id")).values(
        status=RUNNING, started_at_ms=func.coalesce(runs.c.started_at_ms, _int("started")),
        finished_at_ms=null(), owner_host_id=_txt("o_host"), owner_pid=_int("o_pid"), owner_nonce=_txt("o_nonce"),
        heartbeat_at_ms=_int("hb"), claim_host_id=null(), claim_pid=null(), claim_nonce=null(), claimed_at_ms=null(),
    )
)

_owned = and_(
    runs.c.run_id == _txt("run_id"), runs.c.status == RUNNING, runs.c.owner_host_id == _txt("o_host"),
    runs.c.owner_pid == _int("o_pid"), runs.c.owner_nonce == _txt("o_nonce"),
)

HEARTBEAT_RUN = Sql(
    runs.update().where(_owned).values(
        heartbeat_at_ms=greatest(func.coalesce(runs.c.heartbeat_at_ms, _int("hb")), _int("hb"))
    ).returning(runs.c.heartbeat_at_ms)
)

# heartbeat_many: mirror the renewed lease stamps onto every owned row in one statement. Rows whose
# lease stamp differs from ``hb`` (a lease ahead of this reading) are mirrored one by one. No
# ``status = 'running'`` term: the owner-invariant CHECK already makes "owner set" mean running, and
# without it the only indexable term is the primary-key probe per id (PostgreSQL otherwise may pick
# the status index and test every row against the whole id array: quadratic in the batch).
HEARTBEAT_MANY_RUNS = Sql(
    runs.update().where(
        in_json_ids(runs.c.run_id, "ids"), runs.c.owner_host_id == _txt("o_host"),
        runs.c.owner_pid == _int("o_pid"), runs.c.owner_nonce == _txt("o_nonce"),
    ).values(
        heartbeat_at_ms=greatest(func.coalesce(runs.c.heartbeat_at_ms, _int("hb")), _int("hb"))
    ).returning(runs.c.run_id, runs.c.heartbeat_at_ms)
)

EXISTING_IDS = Sql(select(runs.c.run_id).where(in_json_ids(runs.c.run_id, "ids")))

# guard: 0 none, 1 cancel request absent, 2 present (compiled into the same UPDATE as the fence).
_guard_ok = or_(
    _int("guard") == literal_column("0"),
    and_(_int("guard") == literal_column("1"), runs.c.cancel_requested_at_ms.is_(None)),
    and_(_int("guard") == literal_column("2"), runs.c.cancel_requested_at_ms.is_not(None)),
)

TRANSITION_RUNNING = Sql(
    runs.update().where(_owned, _guard_ok).values(
        state_json=func.coalesce(_txt("state_json"), runs.c.state_json), finished_at_ms=null(),
    ).returning(runs.c.run_id)
)

TRANSITION_SETTLE = Sql(
    runs.update().where(_owned, _guard_ok).values(
        status=_txt("to"), state_json=func.coalesce(_txt("state_json"), runs.c.state_json),
        failure_json=_txt("failure_json"), finished_at_ms=_int("finished"),
        owner_host_id=null(), owner_pid=null(), owner_nonce=null(),
        heartbeat_at_ms=null(), claim_host_id=null(), claim_pid=null(), claim_nonce=null(), claimed_at_ms=null(),
    ).returning(runs.c.run_id)
)

SELECT_CANCEL_STATE = Sql(
    select(runs.c.status, runs.c.cancel_requested_at_ms).where(runs.c.run_id == _txt("run_id"))
)

REQUEST_CANCEL = Sql(
    runs.update().where(
        runs.c.run_id == _txt("run_id"), runs.c.cancel_requested_at_ms.is_(None),
        _LIVE,
    ).values(cancel_requested_at_ms=_int("now")).returning(runs.c.run_id)
)

# Lineage of a named run: L = COALESCE(lineage_id, run_id) of that row; members are rows with
# lineage_id = L, plus the row whose run_id is L when it has no lineage or that same one.
_anchor = (
    select(func.coalesce(runs.c.lineage_id, runs.c.run_id)).where(runs.c.run_id == _txt("run_id"))
    .scalar_subquery()
)
_member = or_(
    runs.c.lineage_id == _anchor,
    and_(runs.c.run_id == _anchor, or_(runs.c.lineage_id.is_(None), runs.c.lineage_id == _anchor)),
)
_round_order = (func.coalesce(runs.c.round_ordinal, literal_column("0")), runs.c.run_id)

REQUEST_CANCEL_LINEAGE = Sql(
    runs.update().where(
        _member, runs.c.cancel_requested_at_ms.is_(None), _LIVE,
    ).values(cancel_requested_at_ms=_int("now")).returning(runs.c.run_id)
)

LINEAGE_CANCEL_STATE = Sql(
    select(runs.c.run_id, runs.c.status, runs.c.cancel_requested_at_ms).where(_member).order_by(*_round_order)
)

LINEAGE_ROWS = Sql(select(*RUN_COLUMNS).where(_member).order_by(*_round_order))

LATEST_ROUND = Sql(
    select(*RUN_COLUMNS).where(runs.c.lineage_id == _anchor, runs.c.round_ordinal.is_not(None))
    .order_by(runs.c.round_ordinal.desc(), runs.c.run_id.desc()).limit(literal_column("1"))
)

ACK_CANCEL = Sql(
    runs.update().where(_owned, runs.c.cancel_requested_at_ms.is_not(None)).values(
        cancel_acknowledgement_json=func.coalesce(runs.c.cancel_acknowledgement_json, _txt("ack"))
    ).returning(runs.c.run_id)
)

# --------------------------------------------------------------------------- attempts

ATTEMPT_COLUMNS = (
    at.c.run_id, at.c.step_key_digest, at.c.attempt, at.c.state, at.c.started_at_ms, at.c.finished_at_ms,
    at.c.heartbeat_at_ms, at.c.checkpoint_json, at.c.error_json, at.c.outcome_json, at.c.meta_json,
)

# The attempt store never carries its own ownership: every write embeds the run's fence.
_run_fence = exists(
    select(literal_column("1")).select_from(runs).where(
        runs.c.run_id == _txt("run_id"), runs.c.status == RUNNING, runs.c.owner_host_id == _txt("o_host"),
        runs.c.owner_pid == _int("o_pid"), runs.c.owner_nonce == _txt("o_nonce"),
    )
)
_attempt_pk = and_(at.c.run_id == _txt("run_id"), at.c.step_key_digest == _txt("digest"),
                   at.c.attempt == _int("attempt"))
_in_progress = in_json_ids(at.c.state, "in_progress")

SELECT_ATTEMPT = Sql(select(*ATTEMPT_COLUMNS).where(_attempt_pk))
# Every attempt of one run, oldest first (the primary key's prefix serves it), bounded by :n.
SELECT_RUN_ATTEMPTS = Sql(
    select(*ATTEMPT_COLUMNS).where(at.c.run_id == _txt("run_id"))
    .order_by(at.c.started_at_ms, at.c.step_key_digest, at.c.attempt).limit(_int("n"))
)

SELECT_OWNER_STATE = Sql(
    select(runs.c.status, runs.c.owner_host_id, runs.c.owner_pid, runs.c.owner_nonce)
    .where(runs.c.run_id == _txt("run_id"))
)

_attempt_values = (
    _txt("state"), _int("started"), _int("finished"), _int("hb"), _txt("checkpoint"), _txt("error"),
    _txt("outcome"), _txt("meta"),
)

def _insert_attempt(dialect_insert: Any) -> Any:
    cols = ["run_id", "step_key_digest", "attempt", "state", "started_at_ms", "finished_at_ms",
            "heartbeat_at_ms", "checkpoint_json", "error_json", "outcome_json", "meta_json"]
    src = select(_txt("run_id"), _txt("digest"), _int("attempt"), *_attempt_values).where(_run_fence)
    return dialect_insert(at).from_select(cols, src).on_conflict_do_nothing().returning(at.c.run_id)


INSERT_ATTEMPT_FENCED = PerDialect(lambda backend: _insert_attempt(backend.insert))

UPSERT_ATTEMPT = Sql(
    at.update().where(_attempt_pk, _in_progress, _run_fence).values(
        state=_txt("state"), started_at_ms=_int("started"), finished_at_ms=_int("finished"),
        heartbeat_at_ms=_int("hb"), checkpoint_json=_txt("checkpoint"), error_json=_txt("error"),
        outcome_json=_txt("outcome"), meta_json=_txt("meta"),
    ).returning(at.c.run_id)
)

HEARTBEAT_ATTEMPT = Sql(
    at.update().where(_attempt_pk, _in_progress, _run_fence).values(
        heartbeat_at_ms=greatest(func.coalesce(at.c.heartbeat_at_ms, _int("hb")), _int("hb")),
        checkpoint_json=func.coalesce(_txt("checkpoint"), at.c.checkpoint_json),
    ).returning(at.c.heartbeat_at_ms)
)

FINISH_ATTEMPT = Sql(
    at.update().where(_attempt_pk, _in_progress, _run_fence).values(
        state=_txt("state"), finished_at_ms=_int("finished"),
        error_json=func.coalesce(_txt("error"), at.c.error_json),
        outcome_json=func.coalesce(_txt("outcome"), at.c.outcome_json),
        meta_json=func.coalesce(_txt("meta"), at.c.meta_json),
    ).returning(at.c.run_id)
)

PATCH_ATTEMPT = Sql(
    at.update().where(_attempt_pk, _run_fence).values(
        checkpoint_json=func.coalesce(_txt("checkpoint"), at.c.checkpoint_json),
        error_json=func.coalesce(_txt("error"), at.c.error_json),
        outcome_json=func.coalesce(_txt("outcome"), at.c.outcome_json),
        meta_json=func.coalesce(_txt("meta"), at.c.meta_json),
    ).returning(at.c.run_id)
)

ATTEMPT_EXISTS = Sql(select(literal_column("1")).where(_attempt_pk))

RUN_EXISTS = Sql(select(literal_column("1")).select_from(runs).where(runs.c.run_id == _txt("run_id")))

# The unique (lineage_id, round_ordinal) index serves it: is this round of the lineage taken?
ROUND_EXISTS = Sql(
    select(literal_column("1")).select_from(runs)
    .where(runs.c.lineage_id == _txt("lineage_id"), runs.c.round_ordinal == _int("round_ordinal"))
)

SELECT_FENCE_STATE = Sql(
    select(runs.c.status, runs.c.owner_host_id, runs.c.owner_pid, runs.c.owner_nonce, runs.c.cancel_requested_at_ms)
    .where(runs.c.run_id == _txt("run_id"))
)
