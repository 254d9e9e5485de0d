"""Consensus strategies: who may own a run (line A, REFERENCE 3.3).

The run store asks the strategy inside the same serialized write transaction as the run-row
mutation and mirrors its decision onto the row; the journal asks ``guard`` before a fenced append.
One instance is shared by both (``fencepost.open(..., consensus=...)``), so they always agree on
who holds a run. Every method takes the open ``conn`` of the caller's write transaction and never
opens one itself, so a rolled-back ownership write also rolls back its lease.

``SqlConsensus`` keeps the lease in ``flows_consensus_leases``: one row per run that is claimed
or owned, pruned once neither is set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Protocol

import msgspec
from sqlalchemy import BigInteger, Text, and_, bindparam, exists, func, literal_column, null, select
from sqlalchemy.engine import Connection

from fencepost._dialects import greatest, in_json_ids
from fencepost._schema import flows_consensus_leases as leases
from fencepost._statements import PerDialect, Sql, run
from fencepost.journal._sql import heads_select
from fencepost.journal.owner import OwnerId

STALE_AFTER_MS = 30_000  # mirrors fencepost.runstore.heartbeat.STALE_AFTER (asserted equal in tests)


class Decision(msgspec.Struct, frozen=True, tag=True):
    """What the strategy decided."""


class Claimed(Decision, frozen=True):
    """The claim was granted at ``granted_at_ms`` (the token ``activate`` must present)."""

    granted_at_ms: int


class Activated(Decision, frozen=True):
    """The claim was traded for ownership."""


class Renewed(Decision, frozen=True):
    """The lease was renewed; ``heartbeat_at_ms`` is the stamp now held (never moves back)."""

    heartbeat_at_ms: int


class Recovered(Decision, frozen=True):
    """A stale claim was cleared."""


class Lost(Decision, frozen=True):
    """The caller does not hold what it presented."""


class Rejected(Decision, frozen=True):
    """Refused, with ``reason`` one of ``already_claimed``, ``owner_held``, ``owner_live``,
    ``evidence_invalid``, ``claim_fresh``, ``claim_changed``, ``unavailable``."""

    reason: str


def evidence_matches(evidence: Any, displaced: OwnerId | None, actor: OwnerId, now_ms: int) -> bool:
    """True when ``evidence`` may displace ``displaced`` for ``actor`` at ``now_ms`` exactly.

    The evidence must name the displaced owner (whole triple), be checked at ``now_ms`` exactly
    (a probe is never replayed), and its kind's host rule must hold: ``same-host-pid-dead`` needs the
    same host, ``cross-host-unreachable-stale`` a different one, ``lease-expired`` any host.
    """
    if evidence is None or displaced is None:
        return False
    if evidence.expected_owner != displaced or evidence.checked_at_ms != now_ms:
        return False
    kind = evidence.kind
    if kind == "same-host-pid-dead":
        return actor.host_id == displaced.host_id
    if kind == "cross-host-unreachable-stale":
        return actor.host_id != displaced.host_id
    return kind == "lease-expired"


class Consensus(Protocol):
    """A strategy that arbitrates run ownership inside the caller's write transaction."""

    def guard(self, conn: Connection, run_id: str, owner: OwnerId) -> bool:
        """True when ``owner`` (the whole triple) holds ``run_id`` right now, in ``conn``'s transaction."""
        ...

    def claim(self, conn: Connection, run_id: str, claimant: OwnerId, now_ms: int) -> Claimed | Rejected: ...

    def activate(self, conn: Connection, run_id: str, owner: OwnerId, granted_at_ms: int,
                 now_ms: int) -> Activated | Lost: ...

    def heartbeat(self, conn: Connection, run_id: str, owner: OwnerId, now_ms: int) -> Renewed | Lost: ...

    def reconfirm(self, conn: Connection, run_id: str, owner: OwnerId, now_ms: int) -> Renewed | Lost: ...

    def release(self, conn: Connection, run_id: str, owner: OwnerId) -> None: ...

    def steal(self, conn: Connection, run_id: str, claimant: OwnerId, now_ms: int,
              evidence: Any) -> Claimed | Rejected: ...

    def recover(self, conn: Connection, run_id: str, stale_claimant: OwnerId, granted_at_ms: int,
                observer: OwnerId, now_ms: int, evidence: Any) -> Recovered | Rejected: ...


class StrategyAnswerError(TypeError):
    """A strategy answered with a value its method may not return (the message names types only)."""


def _expect(strategy: Any, method: str, value: Any, kinds: tuple[type, ...]) -> Any:
    if type(value) in kinds or (bool not in kinds and isinstance(value, kinds)):
        return value
    expected = " or ".join(k.__name__ for k in kinds)
    raise StrategyAnswerError(f"consensus strategy {type(strategy).__name__}.{method} returned "
                              f"{type(value).__name__}, expected {expected}")


def _checked_heartbeat_many(strategy: Any, conn: Connection, owner: OwnerId, run_ids: Iterable[str], now_ms: int,
                            ids_json: str | None = None) -> dict[str, int]:
    """``strategy.heartbeat_many``, its answer's type checked (``CheckedConsensus.heartbeat_many``)."""
    out = strategy.heartbeat_many(conn, owner, run_ids, now_ms, ids_json)
    _expect(strategy, "heartbeat_many", out, (dict,))
    for rid, stamp in out.items():
        if type(rid) is not str or type(stamp) is not int:
            raise StrategyAnswerError(f"consensus strategy {type(strategy).__name__}.heartbeat_many "
                                      f"returned a {type(rid).__name__}: {type(stamp).__name__} member, "
                                      "expected str: int")
    return out


class CheckedConsensus:
    """An injected strategy, asked method by method, with every answer's type checked.

    The run store and the journal ask a strategy passed to ``fencepost.open(consensus=...)``
    through this: an answer of the wrong type (``guard`` answering ``Lost()`` or ``"False"``,
    ``claim`` answering ``True``) raises ``StrategyAnswerError`` instead of being read as a
    grant or a refusal. The built-in ``SqlConsensus`` is asked directly.
    """

    def __init__(self, strategy: Consensus) -> None:
        self.strategy = strategy
        #: The strategy's batch renewal, checked; None when it has none (the run store then asks
        #: ``heartbeat`` once per run).
        self.heartbeat_many: Callable[[Connection, OwnerId, Iterable[str], int, str | None], dict[str, int]] | None = (
            None if getattr(strategy, "heartbeat_many", None) is None else partial(_checked_heartbeat_many, strategy))

    def guard(self, conn: Connection, run_id: str, owner: OwnerId) -> bool:
        return _expect(self.strategy, "guard", self.strategy.guard(conn, run_id, owner), (bool,))

    def claim(self, conn: Connection, run_id: str, claimant: OwnerId, now_ms: int) -> Claimed | Rejected:
        return _expect(self.strategy, "claim", self.strategy.claim(conn, run_id, claimant, now_ms),
                       (Claimed, Rejected))

    def activate(self, conn: Connection, run_id: str, owner: OwnerId, granted_at_ms: int,
                 now_ms: int) -> Activated | Lost:
        return _expect(self.strategy, "activate",
                       self.strategy.activate(conn, run_id, owner, granted_at_ms, now_ms), (Activated, Lost))

    def heartbeat(self, conn: Connection, run_id: str, owner: OwnerId, now_ms: int) -> Renewed | Lost:
        return _expect(self.strategy, "heartbeat", self.strategy.heartbeat(conn, run_id, owner, now_ms),
                       (Renewed, Lost))

    def reconfirm(self, conn: Connection, run_id: str, owner: OwnerId, now_ms: int) -> Renewed | Lost:
        return _expect(self.strategy, "reconfirm", self.strategy.reconfirm(conn, run_id, owner, now_ms),
                       (Renewed, Lost))

    def release(self, conn: Connection, run_id: str, owner: OwnerId) -> None:
        self.strategy.release(conn, run_id, owner)

    def steal(self, conn: Connection, run_id: str, claimant: OwnerId, now_ms: int,
              evidence: Any) -> Claimed | Rejected:
        return _expect(self.strategy, "steal", self.strategy.steal(conn, run_id, claimant, now_ms, evidence),
                       (Claimed, Rejected))

    def recover(self, conn: Connection, run_id: str, stale_claimant: OwnerId, granted_at_ms: int,
                observer: OwnerId, now_ms: int, evidence: Any) -> Recovered | Rejected:
        return _expect(self.strategy, "recover",
                       self.strategy.recover(conn, run_id, stale_claimant, granted_at_ms, observer, now_ms, evidence),
                       (Recovered, Rejected))


def checked(strategy: Consensus) -> Any:
    """``strategy`` itself when it is the built-in one, else ``CheckedConsensus(strategy)``."""
    return strategy if type(strategy) is SqlConsensus else CheckedConsensus(strategy)


# --------------------------------------------------------------------------- statements

def _t(name: str) -> Any:
    return bindparam(name, type_=Text)


def _i(name: str) -> Any:
    return bindparam(name, type_=BigInteger)


_rid = leases.c.run_id == _t("run_id")
_owner_is = and_(leases.c.owner_host_id == _t("o_host"), leases.c.owner_pid == _i("o_pid"),
                 leases.c.owner_nonce == _t("o_nonce"))
_claim_is = and_(leases.c.claim_host_id == _t("c_host"), leases.c.claim_pid == _i("c_pid"),
                 leases.c.claim_nonce == _t("c_nonce"))
_no_claim = leases.c.claim_host_id.is_(None)
_cutoff = _i("now") - literal_column(str(STALE_AFTER_MS))

GUARD = Sql(select(literal_column("1")).select_from(leases).where(_rid, _owner_is))
# The guard fused into the journal's head lookup: a fenced append's fence check and heads in one
# statement (one round trip on PostgreSQL, one statement fewer on SQLite).
GUARDED_HEADS = Sql(heads_select(exists().where(_rid, _owner_is)))

READ = Sql(
    select(leases.c.owner_host_id, leases.c.owner_pid, leases.c.owner_nonce, leases.c.heartbeat_at_ms,
           leases.c.claim_host_id, leases.c.claim_pid, leases.c.claim_nonce, leases.c.claimed_at_ms)
    .where(_rid)
)



def _claim_upsert(dialect_insert: Any) -> Any:
    # One statement: a run without a lease row gets one; an existing row takes the claim only
    # while it has neither claim nor owner (otherwise nothing is returned).
    ins = dialect_insert(leases).values(
        run_id=_t("run_id"), claim_host_id=_t("c_host"), claim_pid=_i("c_pid"), claim_nonce=_t("c_nonce"),
        claimed_at_ms=_i("now"),
    )
    return ins.on_conflict_do_update(
        index_elements=[leases.c.run_id],
        set_={"claim_host_id": ins.excluded.claim_host_id, "claim_pid": ins.excluded.claim_pid,
              "claim_nonce": ins.excluded.claim_nonce, "claimed_at_ms": ins.excluded.claimed_at_ms},
        where=and_(_no_claim, leases.c.owner_host_id.is_(None)),
    ).returning(leases.c.run_id)


CLAIM = PerDialect(lambda backend: _claim_upsert(backend.insert))

ACTIVATE = Sql(
    leases.update().where(_rid, _claim_is, leases.c.claimed_at_ms == _i("granted")).values(
        owner_host_id=leases.c.claim_host_id, owner_pid=leases.c.claim_pid, owner_nonce=leases.c.claim_nonce,
        granted_at_ms=_i("granted"), heartbeat_at_ms=_i("now"), claim_host_id=null(), claim_pid=null(),
        claim_nonce=null(), claimed_at_ms=null(),
    ).returning(leases.c.run_id)
)

_renew = greatest(func.coalesce(leases.c.heartbeat_at_ms, _i("now")), _i("now"))

HEARTBEAT = Sql(
    leases.update().where(_rid, _owner_is).values(heartbeat_at_ms=_renew).returning(leases.c.heartbeat_at_ms)
)

HEARTBEAT_MANY = Sql(
    leases.update().where(in_json_ids(leases.c.run_id, "ids"), _owner_is).values(heartbeat_at_ms=_renew)
    .returning(leases.c.run_id, leases.c.heartbeat_at_ms)
)

# Reconfirm succeeds only while no peer has reserved the lease: a stealer wins before it activates.
RECONFIRM = Sql(
    leases.update().where(_rid, _owner_is, _no_claim).values(heartbeat_at_ms=_renew)
    .returning(leases.c.heartbeat_at_ms)
)

# The owner leaving drops the whole lease (its ownership and any claim a stealer holds on it): the
# run row clears its claim columns in the same transaction, and the lease mirrors the row.
RELEASE_OWNER = Sql(leases.delete().where(_rid, _owner_is).returning(leases.c.run_id))

RELEASE_CLAIM = Sql(
    leases.update().where(_rid, _claim_is).values(
        claim_host_id=null(), claim_pid=null(), claim_nonce=null(), claimed_at_ms=null()
    )
)

PRUNE = Sql(leases.delete().where(_rid, leases.c.owner_host_id.is_(None), _no_claim))

STEAL = Sql(
    leases.update().where(_rid, _owner_is, _no_claim, leases.c.heartbeat_at_ms < _cutoff).values(
        claim_host_id=_t("c_host"), claim_pid=_i("c_pid"), claim_nonce=_t("c_nonce"), claimed_at_ms=_i("now"),
    ).returning(leases.c.run_id)
)

RECOVER = Sql(
    leases.update().where(_rid, _claim_is, leases.c.claimed_at_ms == _i("granted"),
                          leases.c.claimed_at_ms < _cutoff).values(
        claim_host_id=null(), claim_pid=null(), claim_nonce=null(), claimed_at_ms=null()
    ).returning(leases.c.run_id)
)


def _o(owner: OwnerId) -> dict[str, Any]:
    return {"o_host": owner.host_id, "o_pid": owner.pid, "o_nonce": owner.nonce}


def _c(claimant: OwnerId) -> dict[str, Any]:
    return {"c_host": claimant.host_id, "c_pid": claimant.pid, "c_nonce": claimant.nonce}


_LOST = Lost()
_ACTIVATED = Activated()
_RECOVERED = Recovered()


class SqlConsensus:
    """The database-backed strategy whose lease lives in ``flows_consensus_leases``."""

    def guard(self, conn: Connection, run_id: str, owner: OwnerId) -> bool:
        """True when ``owner`` (the whole triple) holds ``run_id``: a plain lease lookup."""
        p = _o(owner)
        p["run_id"] = run_id
        return run(conn, GUARD, p).fetchone() is not None

    def guard_and_heads(self, conn: Connection, run_id: str, owner: OwnerId, source_id: str) -> tuple[bool, Any]:
        """``guard``, and the journal's heads of ``run_id`` for ``source_id``, in one statement."""
        row = run(conn, GUARDED_HEADS, {"o_host": owner.host_id, "o_pid": owner.pid, "o_nonce": owner.nonce,
                                        "run_id": run_id, "source_id": source_id}).fetchone()
        return bool(row[5]), row[:5]

    def claim(self, conn: Connection, run_id: str, claimant: OwnerId, now_ms: int) -> Claimed | Rejected:
        """Reserve ``run_id`` for ``claimant`` at ``now_ms`` where the lease has neither claim nor owner.

        Refused as ``already_claimed`` (a claim is held) or ``owner_held`` (someone owns it).
        """
        p = _c(claimant)
        p["run_id"] = run_id
        p["now"] = now_ms
        if run(conn, CLAIM, p).fetchone() is None:
            row = run(conn, READ, {"run_id": run_id}).fetchone()
            if row is not None and row[4] is not None:
                return Rejected("already_claimed")
            return Rejected("owner_held")
        return Claimed(now_ms)

    def activate(self, conn: Connection, run_id: str, owner: OwnerId, granted_at_ms: int,
                 now_ms: int) -> Activated | Lost:
        """Trade the claim ``(owner, granted_at_ms)`` for ownership, first heartbeat ``now_ms``.

        A grant is spent once: a second activation with the same token is ``Lost``.
        """
        p = _c(owner)
        p.update(run_id=run_id, granted=granted_at_ms, now=now_ms)
        return _ACTIVATED if run(conn, ACTIVATE, p).fetchone() is not None else _LOST

    def heartbeat(self, conn: Connection, run_id: str, owner: OwnerId, now_ms: int) -> Renewed | Lost:
        """Renew ``owner``'s lease to ``max(stored, now_ms)``; ``Lost`` unless ``owner`` holds it."""
        p = _o(owner)
        p["run_id"] = run_id
        p["now"] = now_ms
        row = run(conn, HEARTBEAT, p).fetchone()
        return _LOST if row is None else Renewed(int(row[0]))

    def heartbeat_many(self, conn: Connection, owner: OwnerId, run_ids: Iterable[str],
                       now_ms: int, ids_json: str | None = None) -> dict[str, int]:
        """Renew every lease ``owner`` holds among ``run_ids`` in one statement: ``{run_id: stamp}``."""
        if ids_json is None:
            ids_json = msgspec.json.encode(list(run_ids)).decode()
        p = _o(owner)
        p["ids"] = ids_json
        p["now"] = now_ms
        return {rid: int(hb) for rid, hb in run(conn, HEARTBEAT_MANY, p).fetchall()}

    def reconfirm(self, conn: Connection, run_id: str, owner: OwnerId, now_ms: int) -> Renewed | Lost:
        """Renew as ``heartbeat`` does, but only while no claim is pending on the lease."""
        p = _o(owner)
        p["run_id"] = run_id
        p["now"] = now_ms
        row = run(conn, RECONFIRM, p).fetchone()
        return _LOST if row is None else Renewed(int(row[0]))

    def release(self, conn: Connection, run_id: str, owner: OwnerId) -> None:
        """Let ``owner`` leave ``run_id``: as owner the lease goes; as claimant its claim does.

        A stranger's release changes nothing; releasing an unknown run is a no-op.
        """
        p = _o(owner)
        p["run_id"] = run_id
        if run(conn, RELEASE_OWNER, p).fetchone() is None:
            p.update(_c(owner))
            if run(conn, RELEASE_CLAIM, p).rowcount:
                run(conn, PRUNE, {"run_id": run_id})

    def steal(self, conn: Connection, run_id: str, claimant: OwnerId, now_ms: int,
              evidence: Any) -> Claimed | Rejected:
        """Reserve a stale owner's lease for ``claimant``; the owner stays until ``activate``.

        The evidence must match the lease owner for ``claimant`` at ``now_ms`` and the lease must be
        stale (heartbeat strictly older than ``now_ms - 30 s``) with no claim pending.
        """
        row = run(conn, READ, {"run_id": run_id}).fetchone()
        if row is None or row[0] is None:
            return Rejected("evidence_invalid")
        holder = OwnerId(row[0], int(row[1]), row[2])
        if not evidence_matches(evidence, holder, claimant, now_ms):
            return Rejected("evidence_invalid")
        if row[4] is not None:
            return Rejected("already_claimed")
        p = _o(holder)
        p.update(_c(claimant))
        p["run_id"] = run_id
        p["now"] = now_ms
        if run(conn, STEAL, p).fetchone() is None:
            return Rejected("owner_live")
        return Claimed(now_ms)

    def recover(self, conn: Connection, run_id: str, stale_claimant: OwnerId, granted_at_ms: int,
                observer: OwnerId, now_ms: int, evidence: Any) -> Recovered | Rejected:
        """Clear the stale claim ``(stale_claimant, granted_at_ms)`` once it is older than 30 s."""
        if not evidence_matches(evidence, stale_claimant, observer, now_ms):
            return Rejected("evidence_invalid")
        p = _c(stale_claimant)
        p.update(run_id=run_id, granted=granted_at_ms, now=now_ms)
        if run(conn, RECOVER, p).fetchone() is None:
            row = run(conn, READ, {"run_id": run_id}).fetchone()
            if (row is not None and row[4] == stale_claimant.host_id and row[5] == stale_claimant.pid
                    and row[6] == stale_claimant.nonce and row[7] == granted_at_ms):
                return Rejected("claim_fresh")
            return Rejected("claim_changed")
        run(conn, PRUNE, {"run_id": run_id})
        return _RECOVERED


__all__ = [
    "Activated", "Claimed", "Consensus", "Decision", "Lost", "Recovered", "Rejected", "Renewed",
    "SqlConsensus", "evidence_matches",
]
