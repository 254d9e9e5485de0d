"""``store.feed``: position, coalesced changes, snapshot reads, keyset listing, follow, rotation.

Every read here runs in one snapshot (``store.db.read``): the watermark is read first and every row
after it comes from the same committed state, bounded by that watermark (REFERENCE 4). Revisions are
allocated by triggers inside serialized write transactions, so they increase in commit order and a
reader paging ``revision > cursor AND revision <= watermark`` never skips a change.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator, Generator, Iterator, Mapping, Sequence
from types import GenericAlias
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import Integer
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from fencepost._durable import DbFailure, map_failure
from fencepost._statements import run
from fencepost._values import identifier_problem, is_safe_int
from fencepost.changefeed import _sql
from fencepost.changefeed.snapshot import SOURCE_SHAPE, Corrupt, check_batch, check_position, decode_run
from fencepost.changefeed.types import (
    Batch,
    Change,
    ChangeBatch,
    ChangePage,
    Missing,
    Observed,
    Position,
    RunPage,
    StopSignal,
)
from fencepost.errors import RunStoreError, SourceChanged

if TYPE_CHECKING:
    from fencepost._store import Store

MAX_CHANGES_LIMIT = 1000
MAX_READ_IDS = 200


def _decode_failed(method: str, detail: str) -> RunStoreError:
    return RunStoreError("decode_failed", method, detail)


def _check_requested_position(position: object, method: str) -> Position:
    if type(position) is not Position:
        raise _decode_failed(method, "position must be a fencepost.Position")
    if type(position.source) is not str or not SOURCE_SHAPE.fullmatch(position.source):
        raise _decode_failed(method, "position.source must be 32 lowercase hex characters")
    if not is_safe_int(position.revision):
        raise _decode_failed(method, "position.revision must be a non-negative safe integer")
    return position


def read_position(conn: Connection) -> Position:
    """The stored position, checked; the watermark every read of one snapshot is bounded by."""
    row = run(conn, _sql.POSITION, {}).fetchone()
    if row is None:
        raise Corrupt("execution source identity is missing")
    check_position(row[0], row[1])
    return Position(row[0], row[1])


class ChangeFeed:
    """The observation surface of one store: read-only, snapshot-consistent, no pollers started.

    A call made inside an open ``store.db.write`` joins that transaction and can see its uncommitted
    rows; publish such an answer only after the write commits.
    """

    MAX_CHANGES_LIMIT = MAX_CHANGES_LIMIT
    MAX_READ_IDS = MAX_READ_IDS

    def __init__(self, store: Store) -> None:
        self._store = store

    # ------------------------------------------------------------------ internals
    def _read(self, method: str, fn: Any) -> Any:
        try:
            return self._store.db.read(fn)
        except DbFailure as exc:
            raise map_failure(exc, RunStoreError, method, "change feed read") from None
        except Corrupt as exc:
            raise _decode_failed(method, str(exc)) from None

    # ------------------------------------------------------------------ position
    def position(self) -> Position:
        """Return the current ``Position(source, revision)`` (the watermark of a fresh snapshot)."""
        return self._read("position", read_position)

    # ------------------------------------------------------------------ changes
    def changes_since(self, position: Position, limit: int = 500) -> ChangeBatch:
        """Return up to ``limit`` (1..1000) changes with a revision above ``position.revision``.

        One snapshot: the watermark is read first and only changes at or below it are returned, in
        revision order, one per run id (the latest). ``next_revision`` is the last returned revision
        when ``has_more``, else the watermark. A position of another source, or one whose revision
        is ahead of the watermark (a restored older copy that kept its source id), raises
        ``SourceChanged``: never compare it, rebuild. A malformed position or limit raises
        ``RunStoreError('decode_failed')``; a database failure ``persistence_failed``.
        """
        method = "changes_since"
        if type(limit) is not int or not 1 <= limit <= MAX_CHANGES_LIMIT:
            raise _decode_failed(method, f"limit must be an integer in 1..{MAX_CHANGES_LIMIT}")
        wanted = _check_requested_position(position, method)

        def body(conn: Connection) -> ChangeBatch:
            current = _current_for(conn, wanted, method)
            rows = run(
                conn, _sql.CHANGES_SINCE, {"after": wanted.revision, "watermark": current.revision, "n": limit + 1}
            ).fetchall()
            has_more = len(rows) > limit
            if has_more:
                rows = rows[:limit]
            source = current.source
            out = [Change(r[0], source, r[1], r[2] == 1) for r in rows]
            next_revision = out[-1].revision if has_more else current.revision
            return ChangeBatch(source, current.revision, out, has_more, next_revision)

        return self._read(method, body)

    def changes_with_snapshots(self, position: Position, limit: int = 500) -> ChangePage:
        """``changes_since`` with the snapshot of every change, read by the same statement.

        Same contract as ``changes_since`` (limit 1..1000, one snapshot bounded by its watermark,
        ``SourceChanged`` for another source or a position ahead of it), plus ``snapshots``: one
        per change, in the same order, each at exactly that change's revision (``Observed``, or
        ``Missing(deleted=True)`` for a tombstone). One query for the page, not one per change
        or per 200 ids; a stored row that breaks an invariant raises ``decode_failed``.
        """
        method = "changes_with_snapshots"
        if type(limit) is not int or not 1 <= limit <= MAX_CHANGES_LIMIT:
            raise _decode_failed(method, f"limit must be an integer in 1..{MAX_CHANGES_LIMIT}")
        wanted = _check_requested_position(position, method)

        def body(conn: Connection) -> ChangePage:
            current = _current_for(conn, wanted, method)
            source, watermark = current.source, current.revision
            params = {"after": wanted.revision, "watermark": watermark, "n": limit + 1}
            rows = _page_rows(conn, params)
            if rows is None:
                rows = run(conn, _sql.CHANGES_WITH_RUNS, params).fetchall()
            has_more = len(rows) > limit
            if has_more:
                rows = rows[:limit]
            changes: list[Change] = []
            snapshots: list[Observed | Missing] = []
            n = len(_sql.RUN_COLUMNS)  # then the change's revision, deleted flag and run id
            for row in rows:
                run_id, revision, deleted = row[n + 2], row[n], row[n + 1]
                if row[0] is None:
                    if deleted != 1:
                        raise Corrupt("a live change row has no run row")
                    if not is_safe_int(revision) or revision == 0 or revision > watermark:
                        raise Corrupt("tombstone revision is outside 1..watermark")
                    snapshots.append(Missing(run_id, source, revision, True))
                else:
                    snapshots.append(decode_run(row[: n + 2], source, watermark))
                changes.append(Change(run_id, source, revision, deleted == 1))
            next_revision = changes[-1].revision if has_more else watermark
            return ChangePage(source, watermark, changes, snapshots, has_more, next_revision)

        return self._read(method, body)

    # ------------------------------------------------------------------ snapshots
    def read(self, run_ids: Sequence[str]) -> Batch:
        """Read up to 200 runs in one snapshot: one ``Observed`` or ``Missing`` per id, in request order.

        Duplicates are kept; an empty request still returns the position. ``Observed.revision`` is
        the run's own change revision (never above ``Batch.revision``); ``Missing`` carries its
        tombstone's revision when the id was deleted, else the batch watermark. Bad ids (not text,
        empty, NUL, lone surrogate, over 1 024 UTF-16 units) or more than 200 ids raise
        ``decode_failed`` before any query; a stored row that breaks an invariant raises
        ``decode_failed`` naming the rule.
        """
        method = "read"
        if isinstance(run_ids, (str, bytes)) or not isinstance(run_ids, Sequence):
            raise _decode_failed(method, "run_ids must be a sequence of run ids")
        if len(run_ids) > MAX_READ_IDS:
            raise _decode_failed(method, f"at most {MAX_READ_IDS} run ids per read (got {len(run_ids)})")
        for index, run_id in enumerate(run_ids):
            problem = identifier_problem(run_id)
            if problem:
                raise _decode_failed(method, f"run_ids[{index}] {problem}")
        ids = list(dict.fromkeys(run_ids))

        def body(conn: Connection) -> Batch:
            current = read_position(conn)
            source, watermark = current.source, current.revision
            if not ids:
                return Batch(source, watermark, [])
            found: dict[str, Observed | Missing] = {}
            read_runs, read_tombstones = _sql.read_statements(self._store.db.backend)
            for row in conn.execute(read_runs, {"ids": ids}):
                found[row.run_id] = decode_run(row, source, watermark)
            absent = [i for i in ids if i not in found]
            if absent:
                for run_id, revision, deleted in conn.execute(read_tombstones, {"ids": absent}):
                    if deleted != 1:
                        raise Corrupt("a live change row has no run row")
                    if not is_safe_int(revision) or revision == 0 or revision > watermark:
                        raise Corrupt("tombstone revision is outside 1..watermark")
                    found[run_id] = Missing(run_id, source, revision, True)
            snapshots: list[Observed | Missing] = []
            for run_id in run_ids:
                snap = found.get(run_id)
                if snap is None:
                    snap = found[run_id] = Missing(run_id, source, watermark, False)
                snapshots.append(snap)
            return Batch(source, watermark, snapshots)

        batch = self._read(method, body)
        try:
            check_batch(run_ids, batch)
        except Corrupt as exc:
            raise RunStoreError("persistence_failed", method, f"incoherent answer: {exc}") from None
        return batch

    # ------------------------------------------------------------------ rotation
    def rotate_source(self) -> Position:
        """Give this database a new random source identity and return the new position.

        The host's explicit act after restoring a backup or writing a divergent copy: every consumer
        position of the old source is then refused (``SourceChanged``) and projections rebuild. The
        revision counter continues; tombstones and change rows stay, so paging the new source from
        revision 0 visits every live run and every tombstone.
        """
        new_source = secrets.token_hex(16)

        def body(conn: Connection) -> Position:
            row = conn.execute(_sql.ROTATE, {"new_source": new_source}).first()
            if row is None:
                raise Corrupt("execution source identity is missing")
            return Position(row.source, row.revision)

        try:
            return self._store.db.write(body)
        except DbFailure as exc:
            raise map_failure(exc, RunStoreError, "rotate_source", "source rotation") from None
        except Corrupt as exc:
            raise _decode_failed("rotate_source", str(exc)) from None

    # ------------------------------------------------------------------ listing
    def list_runs(
        self, filters: Mapping[str, Any] | None = None, cursor: str | None = None, limit: int = 100, *,
        newest_first: bool = False,
    ) -> RunPage:
        """Return one keyset page of runs ordered by ``(created_at_ms, run_id)``; see ``cursor.py``.

        ``newest_first=True`` pages the same key in descending order (pass the flag with its cursor).
        """
        from fencepost.changefeed.listing import list_runs

        return list_runs(self._store, filters, cursor, limit, newest_first=newest_first)

    def iter_runs(
        self,
        filters: Mapping[str, Any] | None = None,
        *,
        cursor: str | None = None,
        page_size: int = 200,
        newest_first: bool = False,
    ) -> Iterator[Observed]:
        """Yield every run matching ``filters`` in listing order, fetching ``list_runs`` pages lazily.

        Each page is one snapshot (a run created after the iteration started can still appear when
        its key sorts later; one deleted meanwhile can be skipped). ``cursor`` resumes a listing.
        """
        from fencepost.changefeed.listing import iter_runs

        return iter_runs(self._store, filters, cursor=cursor, page_size=page_size, newest_first=newest_first)

    def count_runs(self, filters: Mapping[str, Any] | None = None) -> int:
        """How many runs match ``filters`` (the ``list_runs`` filters), counted in one query."""
        from fencepost.changefeed.listing import count_runs

        return count_runs(self._store, filters)

    # ------------------------------------------------------------------ live tail
    def follow(
        self,
        position: Position | None = None,
        *,
        stop: StopSignal | None = None,
        poll_interval: float = 2.0,
    ) -> Generator[Change, None, None]:
        """Yield every change after ``position`` forever, ending only when ``stop`` is set.

        ``position=None`` starts at revision 0 of the current source. Wake-ups come from watchfiles
        on the SQLite files (confirmed with ``PRAGMA data_version``) or from PostgreSQL
        ``LISTEN/NOTIFY``; they are hints only, the query is the truth, and a poll every
        ``poll_interval`` seconds is the safety net. A database that is briefly unavailable is
        retried with backoff without losing the place. ``SourceChanged`` (rotation, restore) and
        ``decode_failed`` are raised to the caller. ``Store.close()`` ends the follower at once,
        one held between changes too: its threads and connections are released, and its next
        ``next()`` raises the store's "the store is closed" error.
        """
        from fencepost.changefeed.follow import follow

        return follow(self, position, stop=stop, poll_interval=poll_interval)

    def follow_batches(
        self,
        position: Position | None = None,
        *,
        stop: StopSignal | None = None,
        poll_interval: float = 2.0,
        limit: int = 500,
    ) -> Generator[ChangePage, None, None]:
        """Yield every page of changes after ``position``, with their snapshots, until ``stop`` is set.

        The paging form of ``follow``: each item is a ``changes_with_snapshots`` page (``limit``
        changes at most, read with their snapshots in one query), so a consumer that applies
        state handles a page at a time. Pages are never empty; wake-ups, the fallback poll,
        retries and errors are as for ``follow``. Resume from the last page's ``next_position``.
        """
        from fencepost.changefeed.follow import follow_batches

        return follow_batches(self, position, stop=stop, poll_interval=poll_interval, limit=limit)

    def afollow(
        self,
        position: Position | None = None,
        *,
        stop: StopSignal | None = None,
        poll_interval: float = 2.0,
    ) -> AsyncGenerator[Change, None]:
        """The asyncio variant of ``follow``: an async generator of the same changes.

        The follower waits on a thread of its own (never the loop, never its default executor);
        leaving the ``async for`` stops that thread and releases its connections without blocking
        the loop. ``stop`` may be a ``threading.Event`` or an ``asyncio.Event`` (any ``StopSignal``).
        It is an async generator: ``await it.aclose()`` ends a follow left before its end at once;
        one never closed stops its thread when it is garbage-collected, and ``Store.close()`` stops
        it in any case (its next iteration raises the store's "the store is closed" error).
        """
        from fencepost.changefeed.follow import afollow

        return afollow(self, position, stop=stop, poll_interval=poll_interval)


# The page statement's columns as the JSON page carries them: an INTEGER column as an int, a TEXT
# column as a str (or null), and the change row's revision and run id always present. Only what
# the row statement's driver would return as exactly that type and value decodes; anything else
# (a REAL, a BLOB, text that is not UTF-8, a value of another type than its column's) fails here.
# (A ``tuple[...]`` of one type per column, built when the module loads: a type checker sees Any.)
_PAGE_ROW: Any = GenericAlias(tuple, tuple(
    (int if c.name == "revision" else str if c.name == "change_run_id"
     else int | None if isinstance(c.type, Integer) else str | None)
    for c in _sql.CHANGES_WITH_RUNS_JSON.stmt.get_final_froms()[0].c
))
_page_decoder = msgspec.json.Decoder(list[_PAGE_ROW])
_SQLITE_TOOBIG = 18


def _page_rows(conn: Connection, params: dict[str, Any]) -> list[Any] | None:
    """SQLite: the rows of ``CHANGES_WITH_RUNS`` read as one JSON page and decoded in one call, or
    None when the page must be read row by row (another backend, or a page the JSON cannot carry
    exactly).

    Each row is the tuple the row statement's driver returns for it, value for value: SQLite writes
    integers and UTF-8 text exactly in JSON, and the decoder accepts nothing else (a REAL, which
    JSON would round, is refused; a BLOB is refused by ``json_array`` itself). The caller then
    decodes the rows as it decodes the driver's, so a page is accepted or refused by the same rule
    either way, and whatever does not come through exactly is read again by the row statement in
    the same snapshot (a failed read statement leaves a SQLite transaction as it was).
    """
    if conn.dialect.name != "sqlite":
        return None
    try:
        found = run(conn, _sql.CHANGES_WITH_RUNS_JSON, params).fetchone()
    except DBAPIError as exc:
        # A BLOB value ("JSON cannot hold BLOB values") or a page over SQLite's length limit.
        code = getattr(exc.orig, "sqlite_errorcode", None)
        if code == _SQLITE_TOOBIG or "JSON cannot hold BLOB" in str(exc.orig):
            return None
        raise
    if found is None or type(found[0]) is not bytes:
        return None
    try:
        rows = _page_decoder.decode(found[0])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    # json_group_array keeps the order the page's subquery delivers; never rely on it unchecked.
    last = -1
    for row in rows:
        if row[-3] <= last:
            return None
        last = row[-3]
    return rows


def _current_for(conn: Connection, wanted: Position, method: str) -> Position:
    """The source's current position, refusing a ``wanted`` position of another source or ahead of it."""
    current = read_position(conn)
    if wanted.source != current.source:
        rotated = SourceChanged("invalid_run", method, "change position belongs to another source: rebuild")
        rotated.rotated = True
        raise rotated
    if wanted.revision > current.revision:
        raise SourceChanged("invalid_run", method, "change position is ahead of the source revision: rebuild")
    return current
