"""Heartbeats: renewing one lease, many at once, and reconfirming (seed ``leases.md``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from sqlalchemy.engine import Connection

from fencepost.journal import consensus as cs
from fencepost.journal.owner import OwnerId
from fencepost.runstore import _checks as check
from fencepost.runstore import _sql as q
from fencepost.runstore import metrics as m
from fencepost.runstore._base import (
    FENCE_LOST,
    NOT_FOUND,
    StoreBase,
    o_params,
)
from fencepost.runstore.outcomes import (
    HeartbeatOutcome,
    ReconfirmOutcome,
    Updated,
    snake_tag,
)


class Leases(StoreBase):
    """The lease part of ``RunStore``: ``heartbeat``, ``reconfirm``, ``heartbeat_many``."""

    def heartbeat(self, run_id: str, owner: OwnerId, now_ms: int) -> HeartbeatOutcome:
        """Renew ``owner``'s lease: ``Updated`` (stamp ``max(stored, now_ms)``), ``FenceLost``, ``NotFound``.

        A late reading that moves nothing is still ``Updated``: the fence held. Nothing is journaled.
        """
        return self._renew_call("heartbeat", run_id, owner, now_ms, reconfirm=False)

    def reconfirm(self, run_id: str, owner: OwnerId, now_ms: int) -> ReconfirmOutcome:
        """Renew as ``heartbeat`` does, but only while no peer has reserved the lease (no claim).

        Called by supervision once the write tolerance has expired: a stealer that reserved the
        stale lease wins even before it activates.
        """
        return self._renew_call("reconfirm", run_id, owner, now_ms, reconfirm=True)

    def _renew_call(self, method: str, run_id: str, owner: OwnerId, now_ms: int, *, reconfirm: bool) -> Any:
        """``heartbeat`` or ``reconfirm`` (``method``): check the arguments, renew in one write, count it."""
        with m.Op(f"RunStore.{method}", m.heartbeats) as op:
            check.run_id(run_id, method)
            check.owner(owner, method)
            now = self._lease_now(now_ms, method)
            op.identity(runId=run_id, ownerHostId=owner.host_id)
            outcome = self._write(method, lambda conn: self._renew(conn, run_id, owner, now, reconfirm=reconfirm))
            op.done(outcome)
            return outcome

    def _renew(self, conn: Connection, run_id: str, owner: OwnerId, now: int, *, reconfirm: bool) -> Any:
        strategy = self._consensus
        d = (strategy.reconfirm if reconfirm else strategy.heartbeat)(conn, run_id, owner, now)
        if isinstance(d, cs.Renewed):
            p = o_params(owner)
            p["run_id"] = run_id
            p["hb"] = d.heartbeat_at_ms
            row = q.run(conn, q.HEARTBEAT_RUN, p).fetchone()
            if row is not None:
                return Updated(row[0])
        # Lease lost, or lease and row disagree: the row decides between gone and taken.
        return FENCE_LOST if q.run(conn, q.RUN_EXISTS, {"run_id": run_id}).fetchone() else NOT_FOUND

    def heartbeat_many(self, owner: OwnerId, run_ids: Iterable[str], now_ms: int) -> dict[str, HeartbeatOutcome]:
        """Renew ``owner``'s lease on many runs in ONE write transaction: ``{run_id: outcome}``.

        Per run, the outcome and effect are exactly those of ``heartbeat`` (lease renewed by the
        strategy, row mirrored, ``Updated``/``FenceLost``/``NotFound``), computed set-based: one
        lease statement, one row statement, one existence probe for the misses. Duplicate ids are
        answered once. Any invalid id refuses the whole batch before anything is written.
        """
        with m.Op("RunStore.heartbeatMany") as op:
            method = "heartbeat_many"
            check.owner(owner, method)
            now = self._lease_now(now_ms, method)
            given = check.many(run_ids, method, "run_ids", "run ids")
            for index, rid in enumerate(given):  # before de-duplicating: an unhashable id is invalid input
                check.run_id(rid, method, f"run_ids[{index}]")
            ids = list(dict.fromkeys(given))
            op.identity(ownerHostId=owner.host_id, runCount=len(ids))
            if not ids:
                return {}
            outcome = self._write(method, lambda conn: self._renew_many(conn, owner, ids, now))
            counts: dict[str, int] = {}
            for o in outcome.values():
                label = snake_tag(o)
                counts[label] = counts.get(label, 0) + 1
            m.count_heartbeats(counts)
            return outcome

    def _renew_many(self, conn: Connection, owner: OwnerId, ids: list[str], now: int) -> dict[str, Any]:
        strategy = self._consensus
        encode = msgspec.json.encode
        many = getattr(strategy, "heartbeat_many", None)
        if many is not None:
            renewed = many(conn, owner, ids, now, encode(ids).decode())
        else:  # a strategy without a batch form: one call per run, same transaction
            renewed = {}
            for rid in ids:
                d = strategy.heartbeat(conn, rid, owner, now)
                if isinstance(d, cs.Renewed):
                    renewed[rid] = d.heartbeat_at_ms
        mirrored: dict[str, Any] = {}
        at_now = [rid for rid, stamp in renewed.items() if stamp == now]
        if at_now:
            p = o_params(owner)
            p["ids"] = encode(at_now).decode()
            p["hb"] = now
            for rid, stamp in q.run(conn, q.HEARTBEAT_MANY_RUNS, p).fetchall():
                mirrored[rid] = Updated(stamp)
        for rid, stamp in renewed.items():
            if stamp != now:  # the lease was ahead of this reading: mirror its own stamp
                p = o_params(owner)
                p["run_id"] = rid
                p["hb"] = stamp
                row = q.run(conn, q.HEARTBEAT_RUN, p).fetchone()
                if row is not None:
                    mirrored[rid] = Updated(row[0])
        misses = [rid for rid in ids if rid not in mirrored]
        if misses:
            existing = {r[0] for r in q.run(conn, q.EXISTING_IDS, {"ids": encode(misses).decode()}).fetchall()}
            for rid in misses:
                mirrored[rid] = FENCE_LOST if rid in existing else NOT_FOUND
        return {rid: mirrored[rid] for rid in ids}
