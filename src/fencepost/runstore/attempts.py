"""``store.attempts``: step attempts fenced by their run's owner (REFERENCE 2.4).

The attempt store never carries its own ownership: ``put``, ``heartbeat``, ``finish`` and
``patch`` each embed ``EXISTS(run is running and owned by the caller)`` in the one statement that
writes, so a displaced owner's late write cannot rewrite the winner's row, and once a run settles
every later attempt write reports ``FenceLost``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy.engine import Connection

from fencepost._durable import DbFailure, map_failure
from fencepost._values import (
    MAXIMUM_JSON_DEPTH,
    MAXIMUM_JSON_NODES,
    encode_json,
    identifier_problem,
    is_safe_int,
    json_equal,
    parse_json_text,
    value_problem,
)
from fencepost.errors import AttemptStoreError
from fencepost.journal.owner import OwnerId, owner_problem
from fencepost.runstore import _sql as q
from fencepost.runstore import metrics as m
from fencepost.runstore.outcomes import (
    AttemptHeartbeatOutcome,
    Conflict,
    ExistingSame,
    FenceLost,
    Finished,
    FinishOutcome,
    Inserted,
    NotFound,
    Patched,
    PatchOutcome,
    PutOutcome,
    RunNotFound,
    StateChanged,
    Updated,
    Upserted,
)
from fencepost.runstore.rows import Attempt, AttemptPolicy

if TYPE_CHECKING:
    from fencepost._store import Store

_UNSET: Any = msgspec.UNSET
_TS = "must be a non-negative safe integer"


def _refuse(method: str, detail: str, code: str = "invalid_attempt") -> AttemptStoreError:
    err = AttemptStoreError(code, method, detail)
    err.cause = {}  # type: ignore[attr-defined]
    return err


#: Marks a refusal of one of an attempt's values by the durable value rules (a non-finite float,
#: a type JSON cannot hold, a lone surrogate ...): its detail names the field and the rule, never the value.
_VALUE_RULE = "_fencepost_value_rule"


def _contract(summary: str, exc: AttemptStoreError) -> str:
    """The refusal of a whole attempt: a broken depth or node limit, or a durable value rule, is
    named with its field. Any other refusal (the attempt's identity ...) is the summary alone."""
    if getattr(exc, "cause", {}).get("limit") or getattr(exc, _VALUE_RULE, False):
        return f"{summary}: {exc.detail}"
    return summary


def validate_policy(policy: object) -> AttemptPolicy:
    """Validate an ``AttemptPolicy`` (None means the defaults); ``invalid_attempt`` otherwise."""
    if policy is None:
        return AttemptPolicy()
    method = "policy"
    if type(policy) is not AttemptPolicy:
        raise _refuse(method, "attempt_policy must be an AttemptPolicy")
    states = policy.in_progress_states
    if type(states) not in (tuple, list) or not states:
        raise _refuse(method, "in_progress_states must be a non-empty sequence of state names")
    for s in states:
        if identifier_problem(s):
            raise _refuse(method, f"in_progress_states entry {identifier_problem(s)}")
    if len(set(states)) != len(states):
        raise _refuse(method, "in_progress_states must be unique")
    cap = policy.max_checkpoint_bytes
    if type(cap) is not int or not 1 <= cap <= AttemptStore.MAXIMUM_CHECKPOINT_BYTES:
        raise _refuse(method, f"max_checkpoint_bytes must be an integer in 1..{AttemptStore.MAXIMUM_CHECKPOINT_BYTES}")
    if policy.put_mode not in ("insert", "upsert"):
        raise _refuse(method, 'put_mode must be "insert" or "upsert"')
    return AttemptPolicy(tuple(states), cap, policy.put_mode)


class AttemptStore:
    """Attempts of a run's steps; every write is fenced by the run's owner in the same statement."""

    MAXIMUM_JSON_DEPTH = MAXIMUM_JSON_DEPTH
    MAXIMUM_JSON_NODES = MAXIMUM_JSON_NODES
    MAXIMUM_CHECKPOINT_BYTES = 16 * 1024 * 1024
    DEFAULT_CHECKPOINT_BYTES = 1024 * 1024

    def __init__(self, store: Store, policy: Any = None) -> None:
        self._store = store
        self._db = store.db
        self.policy = validate_policy(policy)
        self._in_progress = set(self.policy.in_progress_states)
        self._in_progress_json = msgspec.json.encode(list(self.policy.in_progress_states)).decode()

    # ------------------------------------------------------------------ plumbing
    def _write(self, method: str, fn: Callable[[Connection], Any]) -> Any:
        try:
            return self._db.write(fn)
        except DbFailure as exc:
            err = map_failure(exc, AttemptStoreError, method, "attempt")
            err.cause = {"category": exc.category, "code": exc.code}  # type: ignore[attr-defined]
            raise err from None

    def _ident(self, method: str, run_id: object, digest: object, attempt: object) -> dict[str, Any]:
        if identifier_problem(run_id) or identifier_problem(digest) or not is_safe_int(attempt):
            raise _refuse(method, "attempt identity violates the durable identifier contract")
        return {"run_id": run_id, "digest": digest, "attempt": attempt}

    def _owner(self, method: str, owner: object) -> dict[str, Any]:
        p = owner_problem(owner)
        if p:
            raise _refuse(method, f"owner {p}")
        assert type(owner) is OwnerId  # owner_problem refuses anything else
        return {"o_host": owner.host_id, "o_pid": owner.pid, "o_nonce": owner.nonce}

    def _json(self, method: str, field: str, value: Any, *, optional: bool = True) -> str | None:
        if value is None:
            if optional:
                return None
            raise _refuse(method, f"{field} is required")
        p = value_problem(value, max_depth=MAXIMUM_JSON_DEPTH, max_nodes=MAXIMUM_JSON_NODES)
        if p:
            err = _refuse(method, f"{field} {p}")
            setattr(err, _VALUE_RULE, True)
            if "limit of" in p:  # the depth or node limit: callers must learn which one they broke
                err.cause = {"field": field, "limit": "depth" if "depth" in p else "nodes"}  # type: ignore[attr-defined]
            raise err
        return encode_json(value)

    def _checkpoint(self, method: str, value: Any) -> str | None:
        text = self._json(method, "checkpoint", value)
        if text is not None:
            size = len(text.encode("utf-8"))
            if size > self.policy.max_checkpoint_bytes:
                err = _refuse(method, f"checkpoint is {size} bytes, over max_checkpoint_bytes "
                                      f"{self.policy.max_checkpoint_bytes}")
                err.cause = {"field": "checkpoint", "limit": "max_checkpoint_bytes"}  # type: ignore[attr-defined]
                raise err
        return text

    def _attempt(self, method: str, a: object) -> dict[str, Any]:
        """Validate a whole ``Attempt`` and return its bound parameters."""
        if type(a) is not Attempt:
            raise _refuse(method, "attempt must be an Attempt")
        p = self._ident(method, a.run_id, a.step_key_digest, a.attempt)
        if identifier_problem(a.state):
            raise _refuse(method, f"state {identifier_problem(a.state)}")
        if not is_safe_int(a.started_at_ms):
            raise _refuse(method, f"started_at_ms {_TS}")
        for name in ("finished_at_ms", "heartbeat_at_ms"):
            v = getattr(a, name)
            if v is not None and not is_safe_int(v):
                raise _refuse(method, f"{name} {_TS}")
        p.update(state=a.state, started=a.started_at_ms, finished=a.finished_at_ms, hb=a.heartbeat_at_ms,
                 checkpoint=self._checkpoint(method, a.checkpoint), error=self._json(method, "error", a.error),
                 outcome=self._json(method, "outcome", a.outcome),
                 meta=self._json(method, "meta", a.meta, optional=False))
        return p

    def _classify(self, conn: Connection, p: dict[str, Any]) -> Any:
        """A fenced write missed: no attempt, the run not owned, else the state moved on."""
        if q.run(conn, q.ATTEMPT_EXISTS, p).fetchone() is None:
            return NotFound()
        row = q.run(conn, q.SELECT_OWNER_STATE, p).fetchone()
        if row is None or row[0] != "running" or (row[1], row[2], row[3]) != (p["o_host"], p["o_pid"], p["o_nonce"]):
            return FenceLost()
        return StateChanged()

    # ------------------------------------------------------------------ operations
    def put(self, attempt: Attempt, owner: OwnerId) -> PutOutcome:
        """Record an attempt under the run's fence.

        ``Inserted`` for a new attempt; in ``upsert`` mode an in-progress attempt is overwritten
        (``Upserted``); otherwise ``RunNotFound``, ``FenceLost``, or the stored attempt compared with
        this one (JSON compared structurally): ``ExistingSame`` or ``Conflict``.
        """
        with m.Op("AttemptStore.put") as op:
            method = "put"
            if type(attempt) is not Attempt:
                raise _refuse(method, "attempt violates the persistence contract")
            try:
                p = self._attempt(method, attempt)
            except AttemptStoreError as exc:
                raise _refuse(method, _contract("attempt violates the persistence contract", exc)) from None
            p.update(self._owner(method, owner))
            p["in_progress"] = self._in_progress_json
            op.identity(runId=attempt.run_id, stepKeyDigest=attempt.step_key_digest, attempt=attempt.attempt,
                        ownerHostId=owner.host_id)

            def tx(conn: Connection) -> Any:
                if q.run(conn, q.INSERT_ATTEMPT_FENCED, p).fetchone() is not None:
                    return Inserted()
                if self.policy.put_mode == "upsert" and q.run(conn, q.UPSERT_ATTEMPT, p).fetchone() is not None:
                    return Upserted()
                row = q.run(conn, q.SELECT_OWNER_STATE, p).fetchone()
                if row is None:
                    return RunNotFound()
                if row[0] != "running" or (row[1], row[2], row[3]) != (p["o_host"], p["o_pid"], p["o_nonce"]):
                    return FenceLost()
                stored = q.run(conn, q.SELECT_ATTEMPT, p).fetchone()
                if stored is None:  # pragma: no cover - the insert only skips an existing row
                    return Conflict()
                return ExistingSame() if _same(self._decode(stored, method), attempt) else Conflict()

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    def get(self, run_id: str, step_key_digest: str, attempt: int) -> Attempt | None:
        """Read one attempt (unfenced), re-validated: ``decode_failed`` for a corrupt row."""
        with m.Op("AttemptStore.get") as op:
            method = "get"
            p = self._ident(method, run_id, step_key_digest, attempt)
            op.identity(runId=run_id, stepKeyDigest=step_key_digest, attempt=attempt)
            try:
                row = self._db.read(lambda conn: q.run(conn, q.SELECT_ATTEMPT, p).fetchone())
            except DbFailure as exc:
                err = map_failure(exc, AttemptStoreError, method, "attempt")
                err.cause = {"category": exc.category, "code": exc.code}  # type: ignore[attr-defined]
                raise err from None
            return None if row is None else self._decode(row, method)

    def of_run(self, run_id: str, *, limit: int = 1000) -> list[Attempt]:
        """Read up to ``limit`` (1..10 000) attempts of ``run_id`` (unfenced), oldest first, re-validated."""
        with m.Op("AttemptStore.of_run") as op:
            method = "of_run"
            if identifier_problem(run_id):
                raise _refuse(method, "run_id violates the durable identifier contract")
            if not (type(limit) is int and 1 <= limit <= 10_000):
                raise _refuse(method, "limit must be an integer in 1..10000")
            op.identity(runId=run_id)
            try:
                rows = self._db.read(lambda conn: q.run(conn, q.SELECT_RUN_ATTEMPTS,
                                                        {"run_id": run_id, "n": limit}).fetchall())
            except DbFailure as exc:
                err = map_failure(exc, AttemptStoreError, method, "attempt")
                err.cause = {"category": exc.category, "code": exc.code}  # type: ignore[attr-defined]
                raise err from None
            return [self._decode(row, method) for row in rows]

    def heartbeat(self, run_id: str, step_key_digest: str, attempt: int, owner: OwnerId, now_ms: int,
                  checkpoint: Any = None) -> AttemptHeartbeatOutcome:
        """Stamp an in-progress attempt's heartbeat (monotonic) and optionally replace its checkpoint.

        ``Updated``, or on a miss ``NotFound`` (no attempt), ``FenceLost`` (run not owned) or
        ``StateChanged`` (no longer in progress).
        """
        with m.Op("AttemptStore.heartbeat") as op:
            method = "heartbeat"
            p = self._ident(method, run_id, step_key_digest, attempt)
            p.update(self._owner(method, owner))
            if not is_safe_int(now_ms):
                raise _refuse(method, f"now_ms {_TS}")
            p.update(hb=now_ms, checkpoint=self._checkpoint(method, checkpoint), in_progress=self._in_progress_json)
            op.identity(runId=run_id, stepKeyDigest=step_key_digest, attempt=attempt, ownerHostId=owner.host_id)

            def tx(conn: Connection) -> Any:
                row = q.run(conn, q.HEARTBEAT_ATTEMPT, p).fetchone()
                return Updated(row[0]) if row is not None else self._classify(conn, p)

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    def finish(self, attempt: Attempt, owner: OwnerId) -> FinishOutcome:
        """Settle an in-progress attempt into ``attempt.state`` (which must not be in progress).

        Sets state and ``finished_at_ms``; ``error``, ``outcome`` and ``meta`` replace the stored
        values when given and keep them when None (``meta`` empty means keep). A second finish never
        overwrites the winner (``StateChanged``).
        """
        with m.Op("AttemptStore.finish") as op:
            method = "finish"
            try:
                p = self._attempt(method, attempt)
            except AttemptStoreError as exc:
                raise _refuse(method, _contract("finished attempt violates the contract", exc)) from None
            if attempt.state in self._in_progress or attempt.finished_at_ms is None:
                raise _refuse(method, "finished attempt violates the contract")
            if attempt.meta == {}:
                p["meta"] = None
            p.update(self._owner(method, owner))
            p["in_progress"] = self._in_progress_json
            op.identity(runId=attempt.run_id, stepKeyDigest=attempt.step_key_digest, attempt=attempt.attempt,
                        ownerHostId=owner.host_id)

            def tx(conn: Connection) -> Any:
                if q.run(conn, q.FINISH_ATTEMPT, p).fetchone() is not None:
                    return Finished()
                return self._classify(conn, p)

            outcome = self._write(method, tx)
            op.done(outcome)
            return outcome

    def patch(self, run_id: str, step_key_digest: str, attempt: int, owner: OwnerId, *, checkpoint: Any = None,
              error: Any = None, outcome: Any = None, meta: Any = None) -> PatchOutcome:
        """Replace any of an attempt's optional fields (None keeps the stored value), fenced, any state.

        ``Patched``, ``NotFound`` or ``FenceLost``.
        """
        with m.Op("AttemptStore.patch") as op:
            method = "patch"
            p = self._ident(method, run_id, step_key_digest, attempt)
            p.update(self._owner(method, owner))
            p.update(checkpoint=self._checkpoint(method, checkpoint), error=self._json(method, "error", error),
                     outcome=self._json(method, "outcome", outcome), meta=self._json(method, "meta", meta))
            op.identity(runId=run_id, stepKeyDigest=step_key_digest, attempt=attempt, ownerHostId=owner.host_id)

            def tx(conn: Connection) -> Any:
                if q.run(conn, q.PATCH_ATTEMPT, p).fetchone() is not None:
                    return Patched()
                if q.run(conn, q.ATTEMPT_EXISTS, p).fetchone() is None:
                    return NotFound()
                return FenceLost()

            result = self._write(method, tx)
            op.done(result)
            return result

    # ------------------------------------------------------------------ decoding
    def _decode(self, row: Any, method: str) -> Attempt:
        (rid, digest, attempt, state, started, finished, hb, cp, err, out, meta) = row

        def bad(detail: str) -> AttemptStoreError:
            return _refuse(method, f"stored attempt {detail}", "decode_failed")

        if identifier_problem(rid) or identifier_problem(digest) or not is_safe_int(attempt):
            raise bad("has an invalid identity")
        if identifier_problem(state):
            raise bad("has an invalid state")
        if not is_safe_int(started):
            raise bad(f"started_at_ms {_TS}")
        for name, v in (("finished_at_ms", finished), ("heartbeat_at_ms", hb)):
            if v is not None and not is_safe_int(v):
                raise bad(f"{name} {_TS}")
        values: list[Any] = []
        for name, text in (("checkpoint_json", cp), ("error_json", err), ("outcome_json", out), ("meta_json", meta)):
            if text is None:
                if name == "meta_json":
                    raise bad("meta_json is missing")
                values.append(None)
                continue
            v, p = parse_json_text(text)
            if p:
                raise bad(f"{name} is not valid durable JSON")
            values.append(v)
        return Attempt(rid, digest, attempt, state, started, finished, hb, *values)

    # ------------------------------------------------------------------ stubs
    @staticmethod
    def noop(**overrides: Callable[..., Any]) -> NoopAttemptStore:
        """An attempt store that persists nothing: every operation raises ``unknown`` unless overridden."""
        return NoopAttemptStore(**overrides)


def _same(stored: Attempt, given: Attempt) -> bool:
    return (
        stored.state == given.state and stored.started_at_ms == given.started_at_ms
        and stored.finished_at_ms == given.finished_at_ms and stored.heartbeat_at_ms == given.heartbeat_at_ms
        and json_equal(stored.checkpoint, given.checkpoint) and json_equal(stored.error, given.error)
        and json_equal(stored.outcome, given.outcome) and json_equal(stored.meta, given.meta)
    )


def _unknown(method: str) -> Callable[..., Any]:
    def fail(*_a: Any, **_k: Any) -> Any:
        raise _refuse(method, "no attempt store is composed (noop)", "unknown")
    return fail


class NoopAttemptStore:
    """The explicit absence of an attempt store; see ``AttemptStore.noop``."""

    MAXIMUM_JSON_DEPTH = AttemptStore.MAXIMUM_JSON_DEPTH
    MAXIMUM_JSON_NODES = AttemptStore.MAXIMUM_JSON_NODES
    MAXIMUM_CHECKPOINT_BYTES = AttemptStore.MAXIMUM_CHECKPOINT_BYTES
    _METHODS = ("put", "get", "of_run", "heartbeat", "finish", "patch")

    def __init__(self, **overrides: Callable[..., Any]) -> None:
        for name in self._METHODS:
            setattr(self, name, _unknown(name))
        for name, fn in overrides.items():
            if name not in self._METHODS:
                raise TypeError(f"AttemptStore.noop: unknown operation {name!r}")
            setattr(self, name, fn)
