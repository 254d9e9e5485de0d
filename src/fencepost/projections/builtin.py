"""Built-in projections: ``RunsByStatus`` for services, ``OwnershipHistory`` for auditors."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, Table, Text, delete, select
from sqlalchemy import update as sql_update

from fencepost._dialects import in_json_ids
from fencepost.changefeed import Missing, Observed
from fencepost.errors import ProjectionError
from fencepost.journal.owner import OwnerId
from fencepost.journal.replay import Holding, owner_of, ownership_step
from fencepost.projections import _sql
from fencepost.projections.protocol import ConsensusFact, Target

Int = BigInteger().with_variant(Integer(), "sqlite")


def _check_table(projection: str, table: object) -> None:
    """A built-in projection's ``table=`` is a non-empty string (SQLAlchemy would take 5 as '5')."""
    if type(table) is not str or not table:
        raise ProjectionError("invalid_projection", projection, "table must be a non-empty string")


class RunsByStatus:
    """Each live run's status, owner, lifecycle times, cancel state and revision, one row per run.

    Table ``projection_runs_by_status`` (or ``table=``): ``run_id`` primary key, ``status``,
    ``flow_name``, ``owner_host_id``/``owner_pid``/``owner_nonce`` (the running owner, else NULL),
    ``created_at_ms``, ``started_at_ms``, ``finished_at_ms``, ``cancel_requested_at_ms``,
    ``cancel_acknowledged_at_ms``, and the ``source``/``revision`` of the snapshot the row shows.
    A deleted run has no row. Indexed on ``(status, created_at_ms, run_id)``.

    ``by_source=True`` (what ``keyed_by_source()`` returns, and what a builder fed by several named
    sources uses) adds ``source_name`` before ``run_id`` in the primary key: one row per run per source.
    """

    feed = "runs"

    def __init__(self, name: str = "runs_by_status", *, table: str = "projection_runs_by_status",
                 by_source: bool = False) -> None:
        _check_table("RunsByStatus", table)
        self.name = name
        self._define(table, by_source)

    def keyed_by_source(self) -> RunsByStatus:
        """This projection keyed by ``(source_name, run_id)``, for a builder fed by several sources."""
        keyed = copy.copy(self)
        keyed._define(self.table.name, True)
        return keyed

    def _define(self, table: str, by_source: bool) -> None:
        self.by_source = by_source
        md = MetaData()
        key = [Column("source_name", Text, primary_key=True)] if by_source else []
        self.table = Table(
            table,
            md,
            *key,
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
            # Written by its key: on SQLite the key is the table itself (one b-tree fewer per row).
            sqlite_with_rowid=False,
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
        rows: dict[str, tuple[Any, ...]] = {}
        gone: dict[str, None] = {}
        label = target.source_name if self.by_source else None
        for item in updates:
            if isinstance(item, Observed):
                gone.pop(item.run_id, None)
                row = _row(item)
                rows[item.run_id] = row if label is None else (label, *row)
            else:
                rows.pop(item.run_id, None)
                gone[item.run_id] = None
        if gone:
            conn = target.conn
            where = in_json_ids(table.c.run_id, "ids")
            if label is not None:
                where = (table.c.source_name == label) & where
            conn.execute(delete(table).where(where), {"ids": _json_list(gone)})
        if rows:
            key = ("source_name", "run_id") if label is not None else ("run_id",)
            _sql.upsert_values(target.conn, target.backend, table, key, list(rows.values()))


def _json_list(ids: Iterable[str]) -> str:
    return msgspec.json.encode(list(ids)).decode()


def _row(item: Observed) -> tuple[Any, ...]:
    """The row of ``item``, in the table's column order (after ``source_name`` when keyed by it)."""
    owner = item.owner
    cancel = item.cancellation
    ack = cancel.acknowledgement if cancel is not None else None
    return (
        item.run_id,
        item.status,
        item.flow_name,
        owner.host_id if owner else None,
        owner.pid if owner else None,
        owner.nonce if owner else None,
        item.created_at_ms,
        item.started_at_ms,
        item.finished_at_ms,
        cancel.requested_at_ms if cancel else None,
        ack.observed_at_ms if ack else None,
        item.source,
        item.revision,
    )


class OwnershipHistory:
    """Ownership intervals per run, from the journal's ``flows.consensus.*`` facts in position order.

    Table ``projection_ownership_history`` (or ``table=``), keyed by ``(run_id, opened_position)``.
    Each row is a claim on a run and, once activated, the owner's interval:

    * the owner (``owner_host_id``, ``owner_pid``, ``owner_nonce``); how the row began
      (``opened_by``: ``claimed``, ``stolen``, or ``activated`` for an activation with no claim
      before it) with the fact's ``granted_at_ms`` and ``opened_at_ms`` (when the fact was emitted);
    * its activation (``activated_position``, ``activated_at_ms``; NULL for a claim that never
      became ownership);
    * how it ended (``closed_by``, ``closed_position``, ``closed_at_ms``; NULL while open). A claim
      ends ``released`` (abandoned, lost, or dropped when the owner left), ``expired`` or
      ``superseded``; an interval ends ``released`` (its owner left), ``stolen`` (a thief
      activated) or ``displaced``.

    The rows with an ``activated_position`` are exactly the intervals ``fencepost journal replay``
    rebuilds: both apply ``fencepost.journal.replay.ownership_step`` fact by fact. A steal is a
    claim, so it changes no owner until the thief activates; a ``released`` ends only the
    releaser's claim or interval. Contradictions in the facts are recorded as they come
    (verifying them is replay's job); a fact replay applies to no run (``malformed_fact``,
    ``wrong_run``) never reaches ``apply``: the consensus feed leaves it out.

    ``by_source=True`` (what ``keyed_by_source()`` returns, and what a builder fed by several named
    sources uses) adds ``source_name`` before ``run_id`` in the primary key: a run id names a run
    within its own store only.
    """

    feed = "consensus"

    def __init__(self, name: str = "ownership_history", *, table: str = "projection_ownership_history",
                 by_source: bool = False) -> None:
        _check_table("OwnershipHistory", table)
        self.name = name
        self._define(table, by_source)

    def keyed_by_source(self) -> OwnershipHistory:
        """This projection keyed by ``(source_name, run_id, opened_position)``, for several sources."""
        keyed = copy.copy(self)
        keyed._define(self.table.name, True)
        return keyed

    def _define(self, table: str, by_source: bool) -> None:
        self.by_source = by_source
        md = MetaData()
        key = [Column("source_name", Text, primary_key=True)] if by_source else []
        self.table = Table(
            table,
            md,
            *key,
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
            sqlite_with_rowid=False,  # as RunsByStatus: rows are written by their key
        )
        Index(f"{table}_owner_idx", self.table.c.owner_host_id, self.table.c.owner_pid, self.table.c.owner_nonce)
        self.tables = (self.table,)

    def reset(self, target: Target) -> None:
        """Delete every interval."""
        target.conn.execute(delete(target.table(self.table.name)))

    def apply(self, target: Target, update: ConsensusFact) -> None:
        """Fold one consensus fact into the run's claims and intervals (``ownership_step``)."""
        t = target.table(self.table.name)
        conn = target.conn
        fact = update
        owner = owner_of(fact.owner)
        if owner is None:
            return  # replay reports it as malformed and applies nothing
        label = target.source_name if self.by_source else None
        # The run's rows: within its source's share when several sources feed the projection.
        run = [t.c.run_id == fact.run_id] if label is None else [t.c.source_name == label, t.c.run_id == fact.run_id]
        open_rows = conn.execute(
            select(t.c.opened_position, t.c.owner_host_id, t.c.owner_pid, t.c.owner_nonce, t.c.granted_at_ms,
                   t.c.opened_by, t.c.activated_position)
            .where(*run, t.c.closed_position.is_(None))
            .order_by(t.c.opened_position)
        ).all()
        interval = claim = None
        for row in open_rows:  # at most one open interval and one pending claim per run
            if row.activated_position is not None:
                interval = row
            else:
                claim = row

        def holding(row: Any, kind: str) -> Holding | None:
            if row is None:
                return None
            return Holding(OwnerId(row.owner_host_id, int(row.owner_pid), row.owner_nonce), row.granted_at_ms, kind)

        step = ownership_step(holding(interval, "activated"), holding(claim, claim.opened_by if claim else ""),
                              fact.kind, owner, fact.granted_at_ms)

        def close(row: Any, closed_by: str) -> None:
            conn.execute(
                sql_update(t)
                .where(*run, t.c.opened_position == row.opened_position)
                .values(closed_position=fact.revision, closed_by=closed_by, closed_at_ms=fact.emitted_at_ms)
            )

        if step.interval_ended is not None and interval is not None:
            close(interval, step.interval_ended)
        if step.claim_ended is not None and claim is not None:
            close(claim, step.claim_ended)
        if step.activated_claim and claim is not None:
            conn.execute(
                sql_update(t)
                .where(*run, t.c.opened_position == claim.opened_position)
                .values(activated_position=fact.revision, activated_at_ms=fact.emitted_at_ms)
            )
        elif step.interval_opened or (step.claim is not None and fact.kind in ("claimed", "stolen")):
            activated = step.interval_opened
            keyed = {} if label is None else {"source_name": label}
            conn.execute(t.insert().values(
                **keyed, run_id=fact.run_id, opened_position=fact.revision, owner_host_id=owner.host_id,
                owner_pid=owner.pid, owner_nonce=owner.nonce, opened_by="activated" if activated else fact.kind,
                granted_at_ms=fact.granted_at_ms, opened_at_ms=fact.emitted_at_ms,
                activated_position=fact.revision if activated else None,
                activated_at_ms=fact.emitted_at_ms if activated else None, source=fact.source,
            ))
