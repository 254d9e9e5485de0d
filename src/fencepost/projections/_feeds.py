"""Where a builder's updates come from: the run change feed or the journal's consensus facts.

Both answer the same three questions: the source's identity and head (``head``), one page of
updates after a position, bounded by a watermark read in the same snapshot (``page``), and, for the
journal, whether the entry at a checkpoint is still the one that was applied (``anchor_at``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from fencepost._schema import flows_journal_events as ev
from fencepost._schema import flows_run_source as src
from fencepost._values import is_safe_int
from fencepost.errors import JournalError, SourceChanged
from fencepost.projections.protocol import ConsensusFact

if TYPE_CHECKING:
    from fencepost._store import Store

class Page(NamedTuple):
    source: str
    updates: list[Any]  # each has run_id, source, revision
    next_revision: int
    has_more: bool
    anchor: str | None


class RunsFeed:
    """Run snapshots: ``changes_since`` for the ids, ``read`` for their current state."""

    kind = "runs"

    def __init__(self, store: Store) -> None:
        self._store = store

    def head(self) -> tuple[str, int]:
        position = self._store.feed.position()
        return position.source, position.revision

    def anchor_at(self, revision: int) -> str | None:
        return None

    def page(self, source: str, after: int, limit: int) -> Page:
        from fencepost.changefeed import Position

        # The changes and their snapshots come from one statement in one snapshot: every snapshot
        # is at its change's revision, and a rotation is refused for the page as a whole.
        batch = self._store.feed.changes_with_snapshots(Position(source, after), limit)
        return Page(batch.source, batch.snapshots, batch.next_revision, batch.has_more, None)


_FACT_PREFIX = "flows.consensus."
# Only the run store's own facts count (REFERENCE 3.5): any journal writer may name an entry
# ``flows.consensus.*``, on any stream, but only these are transitions the strategy granted.
_FACT_SOURCE = "flows.run-store"
_source_row = select(src.c.source).where(src.c.singleton == 1)
# The last position in index order, as the journal's own head lookup reads it (never an aggregate a
# planner without the table's statistics might run over the whole log).
_journal_head = select(ev.c.position).order_by(ev.c.position.desc()).limit(1)
_facts_after = (
    select(ev.c.position, ev.c.event_type, ev.c.payload_json, ev.c.emitted_at_ms, ev.c.run_id)
    .where(
        ev.c.position > bindparam("after"),
        ev.c.position <= bindparam("head"),
        ev.c.event_type.like(_FACT_PREFIX + "%"),
        ev.c.source_id == _FACT_SOURCE,
    )
    .order_by(ev.c.position)
    .limit(bindparam("limit"))
)
_hash_at = select(ev.c.entry_hash).where(ev.c.position == bindparam("position"))
_payload = msgspec.json.Decoder()


class ConsensusFeed:
    """``flows.consensus.*`` facts in global journal position order (gapless, commit order)."""

    kind = "consensus"

    def __init__(self, store: Store) -> None:
        self._store = store

    def head(self) -> tuple[str, int]:
        def body(conn: Connection) -> tuple[str, int]:
            return conn.execute(_source_row).scalar_one(), int(conn.execute(_journal_head).scalar() or 0)

        return self._store.db.read(body)

    def anchor_at(self, revision: int) -> str | None:
        if revision <= 0:
            return None
        return self._store.db.read(lambda conn: conn.execute(_hash_at, {"position": revision}).scalar())

    def page(self, source: str, after: int, limit: int) -> Page:
        def body(conn: Connection) -> Page:
            current = conn.execute(_source_row).scalar_one()
            head = int(conn.execute(_journal_head).scalar() or 0)
            if current != source or after > head:
                raise SourceChanged(method="consensusFacts")
            rows = _facts(conn, {"after": after, "head": head, "limit": limit + 1})
            has_more = len(rows) > limit
            rows = rows[:limit]
            next_revision = int(rows[-1].position) if has_more else head
            facts = [f for f in (_fact(row, source) for row in rows) if f is not None]
            anchor = conn.execute(_hash_at, {"position": next_revision}).scalar() if next_revision else None
            return Page(source, facts, next_revision, has_more, anchor)

        return self._store.db.read(body)


def _facts(conn: Connection, params: dict[str, int]) -> Sequence[Any]:
    """The facts after a position, in position order, read along the journal's position index.

    PostgreSQL without statistics for the journal (a store just filled, restored, or written faster
    than autovacuum analyses it) guesses that almost no entry is a fact and reads and sorts the whole
    journal for every page: quadratic over a first build where facts are dense. Sorting is turned
    off for this one statement (``set_config`` local to the transaction, the previous value put
    back after it), which leaves the position index, read in order from ``after`` and stopped at
    the limit, as the plan. A statement that fails aborts the transaction, which takes the setting
    with it."""
    if conn.dialect.name != "postgresql":
        return conn.execute(_facts_after, params).all()
    before = conn.exec_driver_sql(  # the setting read first: the subquery is evaluated before the set
        "SELECT b.before, set_config('enable_sort', 'off', true) "
        "FROM (SELECT current_setting('enable_sort') AS before OFFSET 0) AS b").scalar()
    rows = conn.execute(_facts_after, params).all()
    conn.exec_driver_sql("SELECT set_config('enable_sort', %(before)s, true)", {"before": before})
    return rows


def _fact(row: Any, source: str) -> ConsensusFact | None:
    """The fact as projections receive it, or None for an entry replay applies to no run: one
    that names no run or another run than its stream's (``wrong_run``), or a malformed one
    (``malformed_fact``, see ``fact_problem``). Projections and replay thus apply the same facts."""
    from fencepost.journal import companion_stream
    from fencepost.journal.replay import fact_problem

    try:
        payload = _payload.decode(row.payload_json)
    except (msgspec.DecodeError, TypeError):
        # Where the entry is (its position, as journal reads and verify name it); never what it holds.
        where = f" (the entry at position {row.position})" if is_safe_int(row.position) else ""
        raise JournalError("decode_failed", "consensusFacts",
                           f"stored payload cannot be decoded as JSON{where}") from None
    if type(payload) is not dict or type(payload.get("runId")) is not str or not payload["runId"]:
        return None  # names no run (replay: wrong_run or malformed_fact on its stream)
    if row.run_id != companion_stream(payload["runId"]):
        return None  # not on the named run's companion stream: not a fact about that run
    kind = row.event_type[len(_FACT_PREFIX):]
    if fact_problem(kind, payload) is not None:
        return None  # replay reports it as malformed_fact and applies nothing
    emitted = row.emitted_at_ms
    if type(emitted) is not int:
        return None  # stored past the CHECK constraints: replay reports it (chain_broken), applies nothing
    owner = payload.get("owner")
    granted = payload.get("grantedAtMs")
    return ConsensusFact(
        run_id=payload["runId"],
        source=source,
        revision=int(row.position),
        kind=kind,
        owner=owner if isinstance(owner, dict) else None,
        granted_at_ms=granted if type(granted) is int else None,
        emitted_at_ms=emitted,
    )
