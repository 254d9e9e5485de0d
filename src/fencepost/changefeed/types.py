"""The change feed's values: positions, changes, batches and run snapshots (REFERENCE 4).

Every value is a frozen ``msgspec.Struct`` so it can be encoded for the CLI (`--json`) and
compared by value. ``Observed`` and ``Missing`` are tagged, so ``Observed | Missing`` round-trips.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from fencepost._values import is_safe_int
from fencepost.journal.owner import OwnerId

WaitingKind = Literal["timer", "signal", "approval", "quota", "human", "other"]


@runtime_checkable
class StopSignal(Protocol):
    """What a ``stop`` argument may be: anything with an ``is_set()`` method.

    ``threading.Event`` and ``asyncio.Event`` are both ``StopSignal``s, and so is an object of your
    own (a flag set by a signal handler, a deadline). Every ``follow``, ``follow_batches``,
    ``afollow``, a shard set's ``follow``, ``ProjectionBuilder.run`` and ``Worker.run`` take one.
    """

    def is_set(self) -> bool: ...


class Position(msgspec.Struct, frozen=True):
    """A point in one source's revision sequence: ``source`` (32 lowercase hex) and ``revision``.

    Positions from different sources are never compared by revision: a consumer holding another
    source's position must rebuild (``SourceChanged``).
    """

    source: str
    revision: int


class Change(msgspec.Struct, frozen=True):
    """The latest revision of one run id: it was created/updated (``deleted=False``) or deleted.

    The feed is coalesced: intermediate states of a run are not kept, only its newest revision.
    Read the run with ``ChangeFeed.read`` to learn its state, and keep the snapshot's revision.
    """

    run_id: str
    source: str
    revision: int
    deleted: bool

    @property
    def position(self) -> Position:
        """The position just after this change (resume a feed or a follow from here)."""
        return Position(self.source, self.revision)


class ChangeBatch(msgspec.Struct, frozen=True):
    """One page of ``changes_since``, read in one snapshot.

    ``revision`` is the source watermark of that snapshot. ``next_revision`` is where the next page
    starts: the last change's revision when ``has_more``, else the watermark (it advances across
    revisions that coalescing left without a row).
    """

    source: str
    revision: int
    changes: list[Change]
    has_more: bool
    next_revision: int

    @property
    def next_position(self) -> Position:
        """``Position(source, next_revision)``: pass it to the next ``changes_since`` call."""
        return Position(self.source, self.next_revision)


class Acknowledgement(msgspec.Struct, frozen=True):
    """The first owner that observed a cancellation request, and when."""

    observed_at_ms: int
    owner: OwnerId


class Cancellation(msgspec.Struct, frozen=True):
    """Durable cancellation intent and, once observed by the owner, its acknowledgement."""

    requested_at_ms: int
    acknowledgement: Acknowledgement | None


class Waiting(msgspec.Struct, frozen=True):
    """What a parked run waits for. The raw token is never exposed, only its SHA-256 hex digest."""

    kind: WaitingKind
    reason: str
    wake_at_ms: int | None
    token_digest: str | None
    request: Any = None


class Snapshot(msgspec.Struct, frozen=True, tag=True):
    """One answer of ``ChangeFeed.read`` for one requested run id."""

    run_id: str
    source: str
    revision: int


class Observed(Snapshot, frozen=True):
    """A live run as committed at ``revision`` (its own change revision, never above the batch's).

    ``lineage_id`` defaults to the run id and ``round_ordinal`` to 0; ``flow_name`` is the
    ``flowName`` string of the run's state object, when it has one.
    """

    status: str
    flow_name: str | None
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    parent_run_id: str | None
    lineage_id: str
    round_ordinal: int
    owner: OwnerId | None
    cancellation: Cancellation | None
    waiting: Waiting | None


class Missing(Snapshot, frozen=True):
    """No live run has this id: ``deleted=True`` carries its tombstone's revision, ``deleted=False``
    (never seen) carries the batch watermark, so a later creation always has a higher revision."""

    deleted: bool


class Batch(msgspec.Struct, frozen=True):
    """The answer of ``ChangeFeed.read``: the position of the snapshot and one entry per requested id."""

    source: str
    revision: int
    snapshots: list[Observed | Missing]


class ChangePage(msgspec.Struct, frozen=True):
    """One page of ``changes_with_snapshots`` / ``follow_batches``: changes and their snapshots.

    Read in one snapshot: ``snapshots[i]`` is the state of ``changes[i].run_id`` at that change's
    revision (an ``Observed``, or a ``Missing`` with ``deleted=True`` for a tombstone), so no
    separate ``read`` is needed. ``revision``, ``has_more`` and ``next_revision`` mean what they
    mean on ``ChangeBatch``.
    """

    source: str
    revision: int
    changes: list[Change]
    snapshots: list[Observed | Missing]
    has_more: bool
    next_revision: int

    @property
    def next_position(self) -> Position:
        """``Position(source, next_revision)``: where the next page starts."""
        return Position(self.source, self.next_revision)


class RunPage(msgspec.Struct, frozen=True):
    """One page of ``list_runs``: runs in ``(created_at_ms, run_id)`` order, coherent at ``revision``.

    ``cursor`` is None on the last page; otherwise pass it back (with the same filters) for the next.
    """

    runs: list[Observed]
    cursor: str | None
    source: str
    revision: int


def is_newer(incoming: Snapshot | Change | Position, stored: Snapshot | Change | Position) -> bool:
    """True when ``incoming`` may replace ``stored``: same source and a strictly higher revision.

    This is the projection rule (REFERENCE 4): a delayed older observation never overwrites a newer
    one, and a different source is never compared by revision. Anything without a string
    ``source`` and a non-negative integer ``revision`` (``None``, a dict, a revision read back as
    text) is ``ValueError`` naming the argument, never a silent False.
    """
    for name, value in (("incoming", incoming), ("stored", stored)):
        source, revision = getattr(value, "source", None), getattr(value, "revision", None)
        if source is None or revision is None:
            raise ValueError(f"is_newer: {name} must be a Position, Change or snapshot (with source and revision), "
                             f"not {type(value).__name__}")
        if type(source) is not str:
            raise ValueError(f"is_newer: {name}.source must be a string")
        if not is_safe_int(revision):
            raise ValueError(f"is_newer: {name}.revision must be a non-negative safe integer")
    return incoming.source == stored.source and incoming.revision > stored.revision
