"""Built-in projections: ``RunsByStatus`` for services, ``OwnershipHistory`` for auditors."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, Table, Text, delete, select
from sqlalchemy import update as sql_update

from fencepost._dialects import in_json_ids
from fencepost.changefeed import Missing, Observed
from fencepost.projections import _sql
from fencepost.projections.protocol import ConsensusFact, Target

Int = BigInteger().with_variant(Integer(), "sqlite")


class RunsByStatus:
    """Each live run's status, owner, lifecycle times, cancel state and revision, one row per run.

    Table ``projection_runs_by_status`` (or ``table=``): ``run_id`` primary key, ``status``,
    ``flow_name``, ``owner_host_id``/``owner_pid``/``owner_nonce`` (the running owner, else NULL),
    ``created_at_ms``, ``started_at_ms``, ``finished_at_ms``, ``cancel_requested_at_ms``,
    ``cancel_acknowledged_at_ms``, and the ``source``/``revision`` of the snapshot the row shows.
    A deleted run has no row. Indexed on ``(status, created_at_ms, run_id)``.
    """

    feed = "runs"

    def __init__(self, name: str = "runs_by_status", *, table: str = "projection_runs_by_status") -> None:
        self.name = name
        md = MetaData()
        self.table = Table(
            table,
            md,
            Column("run_id", Text, primary_key=True),
            Column("status", Text, nullable=False),
            Column("flow_name", Text),
            Column("owner_host_id", Text),
            Column("owner_pid", Int),
            Column("owner_nonce", Text),
            Column("created_at_ms", Int, nullable=False),
            Column("started_at_ms", Int),
            Column("finished_at_ms", Int),
            Column("cancel_requested_at_ms", Int),
            Column("cancel_acknowledged_at_ms", Int),
            Column("source", Text, nullable=False),
            Column("revision", Int, nullable=False),
        )
        Index(f"{table}_status_idx", self.table.c.status, self.table.c.created_at_ms, self.table.c.run_id)
        self.tables = (self.table,)

    def reset(self, target: Target) -> None:
        """Delete every row."""
        target.conn.execute(delete(target.table(self.table.name)))

    def apply(self, target: Target, update: Observed | Missing) -> None:
        """Upsert the run's row from an ``Observed``; delete it on a ``Missing``."""
        self.apply_batch(target, [update])

    def apply_batch(self, target: Target, updates: Sequence[Observed | Missing]) -> None:
        """Apply a page: the builder hands over at most one update per run id per page."""
        table = target.table(self.table.name)
        rows: dict[str, dict[str, Any]] = {}
        gone: dict[str, None] = {}
        for item in updates:
            if isinstance(item, Observed):
                gone.pop(item.run_id, None)
                rows[item.run_id] = _row(item)
            else:
                rows.pop(item.run_id, None)
                gone[item.run_id] = None
        if gone:
            conn = target.conn
            conn.execute(delete(table).where(in_json_ids(table.c.run_id, "ids")), {"ids": _json_list(gone)})
        if rows:
            _sql.upsert_many(target.conn, target.backend, table, ("run_id",), list(rows.values()))


def _json_list(ids: Iterable[str]) -> str:
    return msgspec.json.encode(list(ids)).decode()


def _row(item: Observed) -> dict[str, Any]:
    owner = item.owner
    cancel = item.cancellation
    ack = cancel.acknowledgement if cancel is not None else None
    return {
        "run_id": item.run_id,
        "status": item.status,
        "flow_name": item.flow_name,
        "owner_host_id": owner.host_id if owner else None,
        "owner_pid": owner.pid if owner else None,
        "owner_nonce": owner.nonce if owner else None,
        "created_at_ms": item.created_at_ms,
        "started_at_ms": item.started_at_ms,
        "finished_at_ms": item.finished_at_ms,
        "cancel_requested_at_ms": cancel.requested_at_ms if cancel else None,
        "cancel_acknowledged_at_ms": ack.observed_at_ms if ack else None,
        "source": item.source,
        "revision": item.revision,
    }


class OwnershipHistory:
    """Ownership intervals per run, from the journal's ``flows.consensus.*`` facts in position order.

    Table ``projection_ownership_history`` (or ``table=``), one row per interval, keyed by
    ``(run_id, opened_position)``: the owner (``owner_host_id``, ``owner_pid``, ``owner_nonce``), how
    it began (``opened_by``: ``claimed``, ``stolen`` or ``activated``) with the fact's
    ``granted_at_ms`` and ``opened_at_ms`` (when the fact was emitted), its activation
    (``activated_position``, ``activated_at_ms``) and how it ended (``closed_by``: ``released``,
    ``stolen``, ``expired`` or ``claimed`` when a new claim supersedes it; ``closed_position``,
    ``closed_at_ms``). An open interval has ``closed_position`` NULL. Rules, fact by fact:
    ``claimed`` closes any open interval and opens one; ``activated`` marks the open interval of the
    same owner (or closes another owner's and opens one); ``stolen`` closes the open interval and
    opens the thief's; ``released`` and ``expired`` close the open interval. Contradictions in the
    facts are recorded as they come: verifying them is ``fencepost journal replay``'s job.
    """

    feed = "consensus"

    def __init__(self, name: str = "ownership_history", *, table: str = "projection_ownership_history") -> None:
        self.name = name
        md = MetaData()
        self.table = Table(
            table,
            md,
            Column("run_id", Text, primary_key=True),
            Column("opened_position", Int, primary_key=True),
            Column("owner_host_id", Text),
            Column("owner_pid", Int),
            Column("owner_nonce", Text),
            Column("opened_by", Text, nullable=False),
            Column("granted_at_ms", Int),
            Column("opened_at_ms", Int, nullable=False),
            Column("activated_position", Int),
            Column("activated_at_ms", Int),
            Column("closed_position", Int),
            Column("closed_by", Text),
            Column("closed_at_ms", Int),
            Column("source", Text, nullable=False),
        )
        Index(f"{table}_owner_idx", self.table.c.owner_host_id, self.table.c.owner_pid, self.table.c.owner_nonce)
        self.tables = (self.table,)

    def reset(self, target: Target) -> None:
        """Delete every interval."""
        target.conn.execute(delete(target.table(self.table.name)))

    def apply(self, target: Target, update: ConsensusFact) -> None:
        """Fold one consensus fact into the run's intervals."""
        t = target.table(self.table.name)
        conn = target.conn
        fact = update
        owner = _owner(fact.owner)
        current = conn.execute(
            select(t.c.opened_position, t.c.owner_host_id, t.c.owner_pid, t.c.owner_nonce)
            .where(t.c.run_id == fact.run_id, t.c.closed_position.is_(None))
            .order_by(t.c.opened_position.desc())
            .limit(1)
        ).first()
        same_owner = current is not None and (current.owner_host_id, current.owner_pid, current.owner_nonce) == owner

        def close(closed_by: str) -> None:
            if current is None:
                return
            conn.execute(
                sql_update(t)
                .where(t.c.run_id == fact.run_id, t.c.opened_position == current.opened_position)
                .values(closed_position=fact.revision, closed_by=closed_by, closed_at_ms=fact.emitted_at_ms)
            )

        def open_(opened_by: str, activated: bool) -> None:
            conn.execute(t.insert().values(
                run_id=fact.run_id, opened_position=fact.revision, owner_host_id=owner[0], owner_pid=owner[1],
                owner_nonce=owner[2], opened_by=opened_by, granted_at_ms=fact.granted_at_ms,
                opened_at_ms=fact.emitted_at_ms, activated_position=fact.revision if activated else None,
                activated_at_ms=fact.emitted_at_ms if activated else None, source=fact.source,
            ))

        if fact.kind == "claimed":
            close("claimed")
            open_("claimed", False)
        elif fact.kind == "activated":
            if same_owner:
                assert current is not None
                conn.execute(
                    sql_update(t)
                    .where(t.c.run_id == fact.run_id, t.c.opened_position == current.opened_position)
                    .values(activated_position=fact.revision, activated_at_ms=fact.emitted_at_ms)
                )
            else:
                close("claimed")
                open_("activated", True)
        elif fact.kind == "stolen":
            close("stolen")
            open_("stolen", False)
        elif fact.kind in ("released", "expired"):
            close(fact.kind)
        # Unknown consensus kinds are facts of a newer writer: skip them rather than guess.


def _owner(owner: dict[str, Any] | None) -> tuple[Any, Any, Any]:
    if not owner:
        return (None, None, None)
    return (owner.get("hostId"), owner.get("pid"), owner.get("nonce"))
