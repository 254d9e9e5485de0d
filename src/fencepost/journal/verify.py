"""Hash-chain verification of the whole journal, for auditors.

Every entry stores ``stream_prev_hash`` (its predecessor in the stream), ``log_prev_hash`` (its
predecessor in the global log) and ``entry_hash``, a SHA-256 over its canonical bytes and both
links. ``verify`` recomputes all of it from the rows alone, in one read snapshot, so it catches an
edited, deleted, reordered or inserted entry even when the append-only triggers were dropped.

What a chain cannot catch on its own: someone who rewrites a whole suffix with freshly computed
hashes, or deletes the newest entries. Keep the reported ``head`` somewhere else (a log line, a
ticket, another database) and pass it back as ``anchor``: the chain then proves everything up to it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from sqlalchemy import LargeBinary, String, bindparam, cast, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from fencepost._durable import Database, DbFailure, carry_failure, failure_code, failure_detail
from fencepost._schema import flows_journal_events as ev
from fencepost._values import is_safe_int
from fencepost.errors import JournalError
from fencepost.journal._append import ZERO_HASH, content_hash, entry_hash, event_id_for

if TYPE_CHECKING:
    from fencepost._store import Store

T = TypeVar("T")

PAGE = 2000
MAX_LISTED = 100  # breaks a report lists (``first_breaks``); ``breaks`` counts every one


class Head(msgspec.Struct, frozen=True):
    """The newest entry of the log: keep it elsewhere and pass it to ``verify(anchor=...)`` later."""

    position: int
    entry_hash: str


class Break(msgspec.Struct, frozen=True):
    """One broken link: which entry, and what differs.

    ``what`` is one of ``position`` (a gap or repeat in the global log), ``log_link`` (the entry does
    not follow its log predecessor), ``seq`` (a gap or repeat in the stream), ``stream_link`` (the
    entry does not follow its stream predecessor), ``content`` (type, payload or meta differ from
    what was hashed), ``entry_hash`` (any other field differs), ``event_id``, ``encoding`` (a stored
    text value of the entry is not valid UTF-8, the columns named; possible on SQLite only), ``integer``
    (a stored ``seq``, ``source_seq`` or ``emitted_at_ms`` is not an integer, the columns named;
    possible on SQLite only, past its CHECK constraints) and ``anchor``. ``seq`` is -1 where it is
    not known (an anchor break, a stored seq that is not an integer).
    ``run_id`` is the run the entry belongs to: the stream itself, or for a companion stream
    (``flows.companion/...``, named by a hash) the run its ``meta.runId`` names when that run hashes
    to the stream; None when it cannot be told (or for an anchor break).
    """

    stream: str
    seq: int
    position: int
    what: str
    detail: str
    run_id: str | None = None


class VerifyReport(msgspec.Struct, frozen=True):
    """``ok`` when every link holds; ``first_break`` is the lowest-position problem, ``breaks`` the count.

    ``first_breaks`` lists the breaks themselves in position order (an anchor break last), at most
    ``MAX_LISTED`` (100) of them, so tampering in several places is named place by place.
    """

    ok: bool
    entries_checked: int
    streams_checked: int
    breaks: int
    first_break: Break | None
    head: Head | None
    first_breaks: tuple[Break, ...] = ()


_PAGE = (
    select(
        ev.c.run_id, ev.c.seq, ev.c.event_id, ev.c.source_id, ev.c.source_seq, ev.c.emitted_at_ms, ev.c.event_type,
        ev.c.payload_json, ev.c.meta_json, ev.c.content_hash, ev.c.position, ev.c.stream_prev_hash,
        ev.c.log_prev_hash, ev.c.entry_hash,
    )
    .where(ev.c.position > bindparam("after"))
    .order_by(ev.c.position)
    .limit(bindparam("n"))
)


def entry_problems(row: Any, prev: Any) -> list[tuple[str, str]]:
    """What is wrong with one stored entry within its stream: ``(what, detail)`` pairs (see
    ``Break``), given where the stream's previous entry left its chain (``chain_after``: its
    ``(seq, entry_hash)``; None for the first). The log's own links (``position``, ``log_link``)
    are the caller's."""
    problems = []
    expected_seq = 0 if prev is None else prev[0] + 1
    if int(row.seq) != expected_seq and not (prev is not None and len(prev) > 2 and int(row.seq) == prev[2] + 1):
        problems.append(("seq", f"expected seq {expected_seq} in the stream, found {int(row.seq)}"))
    if row.stream_prev_hash != (ZERO_HASH if prev is None else prev[1]):
        problems.append(("stream_link", "stream_prev_hash does not match the previous entry in the stream"))
    if content_hash(row.event_type, row.payload_json, row.meta_json) != row.content_hash:
        problems.append(("content", "event type, payload or meta differ from what was hashed"))
    if entry_hash(row._mapping) != row.entry_hash:
        problems.append(("entry_hash", "the entry's fields differ from what was hashed"))
    if event_id_for(row.run_id, row.source_id, int(row.source_seq)) != row.event_id:
        problems.append(("event_id", "event_id is not derived from run_id, source_id and source_seq"))
    return problems


_TEXT_COLUMNS = frozenset(c.name for c in _PAGE.selected_columns if isinstance(c.type, String))
# The page's columns with its text read as the stored bytes (SQLite: CAST AS BLOB keeps them as they are).
_BYTES_COLUMNS = tuple(cast(c, LargeBinary).label(c.name) if c.name in _TEXT_COLUMNS else c
                       for c in _PAGE.selected_columns)
_BYTES_PAGE = select(*_BYTES_COLUMNS).where(ev.c.position > bindparam("after")).order_by(ev.c.position).limit(
    bindparam("n"))


_STREAM_PAGE = (
    select(*_PAGE.selected_columns)
    .where(ev.c.run_id == bindparam("stream"), ev.c.seq > bindparam("after"))
    .order_by(ev.c.seq)
    .limit(bindparam("n"))
)
_STREAM_BYTES_PAGE = (
    select(*_BYTES_COLUMNS)
    .where(ev.c.run_id == bindparam("stream"), ev.c.seq > bindparam("after"))
    .order_by(ev.c.seq)
    .limit(bindparam("n"))
)
# A stream's first page: no bound on ``seq`` at all, so an entry whose seq was stored below 0 by
# hand (past the CHECK) is read, and reported, instead of hiding below ``seq > -1``.
_STREAM_FIRST = select(*_PAGE.selected_columns).where(ev.c.run_id == bindparam("stream")).order_by(
    ev.c.seq).limit(bindparam("n"))
_STREAM_BYTES_FIRST = select(*_BYTES_COLUMNS).where(ev.c.run_id == bindparam("stream")).order_by(
    ev.c.seq).limit(bindparam("n"))


def _stream_statements(after: Any) -> tuple[Any, Any]:
    """The page statements of a stream read after ``after`` (None or below 0: from its start)."""
    if after is None or (type(after) is int and after < 0):
        return _STREAM_FIRST, _STREAM_BYTES_FIRST
    return _STREAM_PAGE, _STREAM_BYTES_PAGE


_NEXT_IN_LOG = (
    select(ev.c.position, ev.c.log_prev_hash)
    .where(ev.c.position > bindparam("after"))
    .order_by(ev.c.position)
    .limit(1)
)


def _page(store: Store, conn: Connection, stmt: Any, as_bytes: Any, params: dict[str, Any]) -> list[Any]:
    """One page of rows; when a stored text value is not UTF-8 (SQLite), the same page again with
    its text read as bytes, so the entry holding it comes back as ``Undecodable`` instead of
    failing the whole read. So does an entry whose integer column holds something else."""
    try:
        rows = conn.execute(stmt, params).all()
    except DBAPIError as exc:
        if store.db.backend.classify(exc)[0] != "decode_failed":
            raise
        return [_decoded(r) for r in conn.execute(as_bytes, params)]
    return [_checked(r) for r in rows]


def stream_page(store: Store, stream: str, after: int, n: int) -> list[Any]:
    """Up to ``n`` stored rows of one stream with ``seq`` above ``after``, in ``seq`` order, read
    as ``stream_rows`` reads them: an entry holding text that is not UTF-8, or an integer column
    holding something else, comes back as ``Undecodable``; the others as stored, for
    ``entry_from_row`` to decode one at a time (``journal show``: one bad entry does not hide the rest)."""
    params = {"stream": stream, "after": after, "n": n}
    stmt, as_bytes = _stream_statements(after)
    try:
        return store.db.read(lambda conn: _page(store, conn, stmt, as_bytes, params))
    except DbFailure as exc:
        raise carry_failure(JournalError(failure_code(exc, "read_failed", closed="journal_closed"), "entries",
                                         failure_detail("journal read", exc)), exc) from None


def decoded(row: Any, method: str) -> tuple[Any, str | None]:
    """A row of ``stream_page`` or ``log_page`` as ``(its Entry, None)``, or, for an entry the journal
    cannot decode, ``(None, what cannot be decoded)``: the columns and the rule, never what they hold
    (``journal show`` and the console show such an entry in its place by seq and position)."""
    from fencepost.journal.entries import entry_from_row

    if type(row) is Undecodable:
        return None, "; ".join(d for _, d in row.problems)
    try:
        return entry_from_row(row, method), None
    except JournalError as exc:
        return None, exc.detail.removesuffix(f" (the entry at position {int(row.position)})")


def log_page(store: Store, after: int, n: int) -> list[Any]:
    """Up to ``n`` stored rows of the log with ``position`` above ``after``, in ``position`` order,
    read as ``stream_page`` reads a stream's: an entry the journal cannot read comes back as
    ``Undecodable``, the others as stored (the console's journal page: one bad entry does not hide
    the rest)."""
    params = {"after": after, "n": n}
    try:
        return store.db.read(lambda conn: _page(store, conn, _PAGE, _BYTES_PAGE, params))
    except DbFailure as exc:
        raise carry_failure(JournalError(failure_code(exc, "read_failed", closed="journal_closed"), "log",
                                         failure_detail("journal read", exc)), exc) from None


def stream_rows(store: Store, conn: Connection, stream: str) -> list[Any]:
    """Every stored row of one stream in append order (all of ``_PAGE``'s columns), read on
    ``conn``; an entry holding text that is not UTF-8, or an integer column holding something
    else, comes back as ``Undecodable``.

    Append order is ``seq`` order, and ``position`` order: the rows are read by ``seq`` and put in
    ``position`` order, which differs only when a seq was stored by hand (one that is not an
    integer sorts after every integer on SQLite), so the chain is checked where the entry was
    appended."""
    rows: list[Any] = []
    after: Any = None
    while True:
        # The first page from the stream's very start; the next ones after the last seq read.
        stmt, as_bytes = (_STREAM_FIRST, _STREAM_BYTES_FIRST) if after is None else (_STREAM_PAGE, _STREAM_BYTES_PAGE)
        page = _page(store, conn, stmt, as_bytes, {"stream": stream, "after": after, "n": PAGE})
        rows.extend(page)
        if len(page) < PAGE:
            rows.sort(key=lambda row: row.position)  # already in order unless a seq was stored by hand
            return rows
        after = page[-1].seq  # as stored: a seq that is not an integer (SQLite) still pages in order


def rows_breaks(conn: Connection, rows: list[Any]) -> list[Break]:
    """Every break of one stream's own chain given all its rows (``stream_rows``): ``seq``,
    ``stream_link``, ``content``, ``entry_hash``, ``event_id``, ``encoding``, one ``Break`` per
    problem; and a ``log_link`` break at its last entry when the log's next entry does not follow
    it (one more statement, on ``conn``): entries removed from the end of a stream leave the rest
    of its chain intact, so only the log shows them (unless they were the journal's newest
    entries, which only an anchor proves). The other links between streams are ``verify``'s: this
    is the check a replay of one run makes on the facts it judges."""
    found: list[Break] = []
    prev: tuple[int, str] | None = None
    for row in rows:
        problems = row.problems if type(row) is Undecodable else entry_problems(row, prev)
        found.extend(Break(stream=row.run_id, seq=_seq_of(row), position=int(row.position), what=what,
                           detail=detail) for what, detail in problems)
        prev = chain_after(row, prev)
    if rows:
        last = rows[-1]
        position = int(last.position)
        nxt = conn.execute(_NEXT_IN_LOG, {"after": position}).first()
        if nxt is not None and (int(nxt.position) != position + 1 or nxt.log_prev_hash != last.entry_hash):
            found.append(Break(stream=last.run_id, seq=_seq_of(last), position=position, what="log_link",
                               detail=f"the log's next entry (position {int(nxt.position)}) does not follow "
                                      "this one: an entry after it, maybe this stream's next, was removed "
                                      "or edited"))
    return found


# The integer columns the checks read. ``position`` is not among them: it is the table's integer
# primary key on SQLite (nothing else can be stored there) and BIGINT, like these, on PostgreSQL.
_INT_COLUMNS = ("seq", "source_seq", "emitted_at_ms")


def _columns_detail(columns: list[str], rule: str, rule_plural: str) -> str:
    return f"stored {', '.join(columns)} {rule if len(columns) == 1 else rule_plural}"


class Undecodable:
    """An entry whose stored values are not of the journal's types, each kind of problem in
    ``problems`` as a ``(what, detail)`` pair naming the columns (see ``Break``), never a value:
    ``encoding``, text that is not UTF-8 (held with U+FFFD in place of each bad byte, so nothing
    shows the stored bytes); ``integer``, a ``seq``, ``source_seq`` or ``emitted_at_ms`` that is not
    an integer (held as stored). Its other checks are not made: they would only repeat these."""

    # Every column of ``_PAGE`` is an attribute; these are the ones read whatever the damage.
    position: int
    run_id: str
    entry_hash: str

    def __init__(self, values: dict[str, Any], problems: list[tuple[str, str]]) -> None:
        self.__dict__.update(values)
        self.problems = problems


def _damaged(values: dict[str, Any], not_utf8: list[str]) -> Undecodable | None:
    """``Undecodable`` for a row's ``values`` (and its text columns that were not UTF-8), or None.

    A text column holding something else (SQLite keeps a BLOB in a TEXT column as it is) is an
    ``encoding`` problem too, held as text (U+FFFD for each byte that is not UTF-8)."""
    problems = []
    if not_utf8:
        problems.append(("encoding", _columns_detail(sorted(not_utf8), "is not valid UTF-8", "are not valid UTF-8")))
    not_text = sorted(name for name in _TEXT_COLUMNS if type(values[name]) is not str)
    if not_text:
        for name in not_text:
            raw = values[name]
            if isinstance(raw, memoryview):
                raw = bytes(raw)
            values[name] = (raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray))
                            else "" if raw is None else str(raw))
        problems.append(("encoding", _columns_detail(not_text, "is not stored as text", "are not stored as text")))
    not_int = [name for name in _INT_COLUMNS if type(values[name]) is not int]
    if not_int:
        problems.append(("integer", _columns_detail(not_int, "is not an integer", "are not integers")))
    return Undecodable(values, problems) if problems else None


def _checked(row: Any) -> Any:
    """A row of ``_PAGE`` as it is, or ``Undecodable`` when an integer column holds something else
    or a text column something that is not text."""
    if (all(type(getattr(row, name)) is int for name in _INT_COLUMNS)
            and all(type(getattr(row, name)) is str for name in _TEXT_COLUMNS)):
        return row
    return _damaged(dict(row._mapping), [])


def _decoded(row: Any) -> Any:
    """A row of ``_BYTES_PAGE`` as ``_PAGE`` would have returned it, or ``Undecodable``."""
    values = dict(row._mapping)
    bad: list[str] = []
    for name in _TEXT_COLUMNS:
        raw = values[name]
        if type(raw) is bytes:
            try:
                values[name] = raw.decode("utf-8")
            except UnicodeDecodeError:
                values[name] = raw.decode("utf-8", "replace")
                bad.append(name)
    return _damaged(values, bad) or _Row(values)


def _seq_of(row: Any) -> int:
    """The entry's seq as a break reports it: -1 when the stored one is not an integer."""
    return row.seq if type(row.seq) is int else -1


def chain_after(row: Any, prev: Any) -> Any:
    """Where a stream's chain stands after ``row``, given where it stood before (None: ``row`` is
    its first entry): ``(seq, entry_hash)``, the seq the next entry follows.

    That is the stored seq, or the one the stream expected there when that is not an integer (one
    damaged entry is one break). When the stored seq is an integer the stream did not expect, the
    next entry may follow either: ``(seq, entry_hash, expected)``. Following the stored seq, an
    entry removed before ``row`` (or one inserted) is one break at ``row``; following the expected
    seq, ``row``'s own seq edited is one break at ``row`` too, not a second at the untouched entry
    after it."""
    expected = 0 if prev is None else prev[0] + 1
    seq = row.seq
    if type(seq) is not int:
        return expected, row.entry_hash
    if seq == expected or (prev is not None and len(prev) > 2 and seq == prev[2] + 1):
        return seq, row.entry_hash
    return seq, row.entry_hash, expected


class _Row:
    """A decoded row of ``_BYTES_PAGE``: its columns as attributes and as ``_mapping``."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
        self._mapping = values


class _Checker:
    def __init__(self) -> None:
        self.expected_position = 1
        self.log_prev = ZERO_HASH
        #: Where each stream's chain stands after its latest entry checked (by this pass): ``chain_after``.
        self.streams: dict[str, Any] = {}
        #: Where a stream this pass has not met yet ends, for a pass that goes on from an earlier one.
        self.earlier: Callable[[str], tuple[int, str] | None] | None = None
        self.stream_count = 0
        self.count = 0
        self.breaks = 0
        self.listed: list[Break] = []
        self.last: Head | None = None

    def going_on(self, earlier: Callable[[str], tuple[int, str] | None]) -> _Checker:
        """A checker that goes on from where this one stands (this one is left as it is), asking
        ``earlier`` where each stream it meets stood, instead of holding every stream."""
        other = _Checker()
        other.__dict__.update(self.__dict__)
        other.streams = {}
        other.earlier = earlier
        other.listed = list(self.listed)
        return other

    def kept(self) -> _Checker:
        """What is worth keeping for a later pass: all but the streams (one entry for each)."""
        self.streams = {}
        self.earlier = None
        return self

    def _previous(self, stream: str) -> Any:
        prev = self.streams.get(stream)
        if prev is None:
            if self.earlier is not None:
                prev = self.earlier(stream)
            if prev is None:
                self.stream_count += 1
        return prev

    def fail(self, row: Any, what: str, detail: str) -> None:
        self.breaks += 1
        if len(self.listed) < MAX_LISTED:
            self.listed.append(Break(stream=row.run_id, seq=_seq_of(row), position=int(row.position), what=what,
                                     detail=detail, run_id=_run_of(row)))

    def undecodable(self, row: Undecodable) -> None:
        """An entry holding values not of the journal's types: one break per kind of problem; the
        chain continues from what it stores (its other checks would only repeat the same break)."""
        self.count += 1
        for what, detail in row.problems:
            self.fail(row, what, detail)
        position = int(row.position)
        self.expected_position = position + 1
        self.log_prev = row.entry_hash
        self.streams[row.run_id] = chain_after(row, self._previous(row.run_id))
        self.last = Head(position=position, entry_hash=row.entry_hash)

    def check(self, row: Any) -> None:
        self.count += 1
        position = int(row.position)
        if position != self.expected_position:
            self.fail(row, "position", f"expected position {self.expected_position}, found {position}")
        if row.log_prev_hash != self.log_prev:
            self.fail(row, "log_link", "log_prev_hash does not match the previous entry in the log")
        prev = self._previous(row.run_id)
        for what, detail in entry_problems(row, prev):
            self.fail(row, what, detail)
        # Continue from what is stored, so one break is reported once, not at every later entry.
        self.expected_position = position + 1
        self.log_prev = row.entry_hash
        self.streams[row.run_id] = chain_after(row, prev)
        self.last = Head(position=position, entry_hash=row.entry_hash)


_meta = msgspec.json.Decoder()


def _run_of(row: Any) -> str | None:
    """The run an entry belongs to (see ``Break.run_id``)."""
    from fencepost.journal import COMPANION_PREFIX, companion_stream

    stream = row.run_id
    if not stream.startswith(COMPANION_PREFIX):
        return stream
    name = stream[len(COMPANION_PREFIX):].rpartition("/")[0]
    try:
        meta = _meta.decode(row.meta_json)
    except (msgspec.DecodeError, TypeError, ValueError, RecursionError):
        return None
    named = meta.get("runId") if type(meta) is dict else None
    if type(named) is str and named and name and companion_stream(named, name) == stream:
        return named
    return None


_HEX = frozenset("0123456789abcdef")


def checked_store(store: object, method: str) -> None:
    """Refuse anything but an open store's handle (a URL, ``None``, ``store.journal``) with
    ``invalid_event`` naming the type given, never the value: a URL can hold a password."""
    if not isinstance(getattr(store, "db", None), Database):
        # A shard set (duck-typed: the journal layer imports nothing above it) has one journal per shard.
        hint = ("; each shard has its own journal: pass one shard's store, shards[name] "
                "(shards.store_for(run_id) for a run's)") if callable(getattr(store, "store_for", None)) else ""
        raise JournalError("invalid_event", method,
                           f"store must be a fencepost Store (from fencepost.open), not {type(store).__name__}{hint}")


def checked_anchor(anchor: object) -> Head:
    """``anchor`` as verify compares it, or ``invalid_event`` naming the field (never its value).

    A malformed anchor must not read as a broken journal: it would be a false tamper alarm. The
    hash is compared in lower case, as printed (an upper-cased copy is the same hash).
    """
    if type(anchor) is not Head:
        raise JournalError("invalid_event", "verify", "anchor must be a Head")
    if not (is_safe_int(anchor.position) and anchor.position >= 1):
        raise JournalError("invalid_event", "verify", "anchor.position must be an integer in 1..2**53-1")
    digest = anchor.entry_hash.lower() if type(anchor.entry_hash) is str else ""
    if len(digest) != 64 or not _HEX.issuperset(digest):
        raise JournalError("invalid_event", "verify", "anchor.entry_hash must be 64 hex digits")
    return Head(position=anchor.position, entry_hash=digest)


_COUNT = select(func.count()).select_from(ev)


def verify(store: Store, *, anchor: Head | None = None,
           on_progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check every link of the journal's hash chains and return a report (never raises on a break).

    Reads the whole log in ``position`` order, ``PAGE`` (2000) entries at a time, inside one read
    snapshot. With ``anchor`` (a ``Head`` recorded earlier), also checks that the entry at that
    position still carries that hash (in any letter case); an anchor that no entry could match (a
    position that is not an integer >= 1, a hash that is not 64 hex digits) is ``invalid_event``
    naming the field, never a break.

    ``on_progress(checked, total)``, when given, is called with ``(0, total)`` before the first
    page and after every page with the entries checked so far; ``total`` is the number of entries
    in the snapshot verified (counted in that snapshot, so the last call has ``checked == total``).
    When the store retries the read after a transient failure (a dropped connection), the calls
    start again from 0. Without it, nothing is counted. An exception it raises (``KeyboardInterrupt``
    ...) ends the verification and propagates.
    """
    checked_store(store, "verify")
    if anchor is not None:
        anchor = checked_anchor(anchor)
    if on_progress is not None and not callable(on_progress):
        raise JournalError("invalid_event", "verify", "on_progress must be callable (or None)")

    def run(conn: Connection) -> tuple[_Checker, str | None]:
        # Everything a pass learns is made here: the store retries this whole read after a
        # transient failure (a dropped connection), and a retry must start from a clean checker.
        checker = _Checker()
        total = 0
        if on_progress is not None:
            total = int(conn.execute(_COUNT).scalar_one())
            on_progress(0, total)
        anchor_hash = _check_from(store, conn, checker, anchor, on_progress, total)
        return checker, anchor_hash

    checker, anchor_hash = _read(store, run)
    if anchor is not None and anchor_hash != anchor.entry_hash:
        _anchor_break(checker, anchor, _ANCHOR_MISSING if anchor_hash is None else _ANCHOR_CHANGED)
    return _report(checker)


_ANCHOR_MISSING = "the anchored entry is missing"
_ANCHOR_CHANGED = "the anchored entry has another hash"


def _anchor_break(checker: _Checker, anchor: Head, detail: str) -> None:
    checker.breaks += 1
    if len(checker.listed) < MAX_LISTED:
        checker.listed.append(Break(stream="", seq=-1, position=anchor.position, what="anchor", detail=detail))


def _check_from(store: Store, conn: Connection, checker: _Checker, anchor: Head | None,
                on_progress: Callable[[int, int], None] | None, total: int) -> str | None:
    """Check every entry after the last one ``checker`` saw (all of them for a new checker), in
    position order; the stored hash of the ``anchor``'s entry when the pass met it."""
    after = 0 if checker.last is None else checker.last.position
    anchor_hash: str | None = None
    while True:
        # An entry holding text that is not UTF-8, or an integer column holding something else
        # (SQLite), is reported as a break, not the whole verify.
        rows = _page(store, conn, _PAGE, _BYTES_PAGE, {"after": after, "n": PAGE})
        for row in rows:
            if type(row) is Undecodable:
                checker.undecodable(row)
            else:
                checker.check(row)
            if anchor is not None and int(row.position) == anchor.position:
                anchor_hash = row.entry_hash
        if on_progress is not None and rows:
            on_progress(checker.count, total)
        if len(rows) < PAGE:
            return anchor_hash
        after = int(rows[-1].position)


def _read(store: Store, body: Callable[[Connection], T]) -> T:
    try:
        return store.db.read(body)
    except DbFailure as exc:
        raise carry_failure(JournalError(failure_code(exc, "read_failed", closed="journal_closed"), "verify",
                                         failure_detail("journal read", exc)), exc) from None


def _report(checker: _Checker) -> VerifyReport:
    return VerifyReport(
        ok=checker.breaks == 0,
        entries_checked=checker.count,
        streams_checked=checker.stream_count,
        breaks=checker.breaks,
        first_break=checker.listed[0] if checker.listed else None,
        head=checker.last,
        first_breaks=tuple(checker.listed),
    )


class _StartOver(Exception):
    """A stream's earlier end cannot be read as it should be: check the whole journal instead."""


_STREAM_END = (
    select(ev.c.seq, ev.c.entry_hash)
    .where(ev.c.run_id == bindparam("stream"), ev.c.position <= bindparam("upto"))
    .order_by(ev.c.seq.desc())
    .limit(1)
)


class Resumable:
    """A verification kept between calls that checks only the entries appended since the last
    one (the console's journal page, shown again and again while the journal grows).

    ``report(store)`` goes on from the last entry it checked when everything it checked so far was
    intact and that entry still stands where it was with the hash it had (read in the same snapshot
    as the new entries); otherwise (a break was found, the journal was rewritten, rolled back or
    replaced), and with ``from_start=True``, it checks the whole journal again. Every whole pass
    also checks the newest entry an earlier pass found intact, as ``verify`` checks an anchor: a
    journal whose newest entries were removed (or rewritten, or replaced by another) after it was
    checked reports an ``anchor`` break at that position, on this and every later call. What it
    cannot see is an older entry altered later without its hash: a whole verification finds that,
    which is why a caller passes ``from_start`` now and then. ``checked_from_start_at``:
    ``time.monotonic()`` of the last whole pass (None before one). Calls are taken one at a time.
    It holds no reference to the store (a cache keyed by the store can let it go).
    """

    def __init__(self) -> None:
        self._checker: _Checker | None = None
        #: The newest entry a pass found with every link intact up to it (None before one).
        self._anchor: Head | None = None
        self._lock = threading.Lock()
        self.checked_from_start_at: float | None = None

    def report(self, store: Store, *, from_start: bool = False) -> VerifyReport:
        checked_store(store, "verify")
        # One call at a time: a pass that ends later must not put back what an earlier one knew.
        with self._lock:
            base = None if from_start else self._checker
            anchor = self._anchor
            started = time.monotonic()
            checker, whole, anchor_hash = _read(store, lambda conn: _resume_or_start(store, conn, base, anchor))
            if whole and anchor is not None and anchor_hash != anchor.entry_hash:
                _anchor_break(checker, anchor, _ANCHOR_MISSING if anchor_hash is None else _ANCHOR_CHANGED)
            elif checker.breaks == 0 and checker.last is not None:
                self._anchor = checker.last
            self._checker = checker.kept()
            if whole:
                self.checked_from_start_at = started
            return _report(checker)


def _resume_or_start(store: Store, conn: Connection, base: _Checker | None,
                     anchor: Head | None) -> tuple[_Checker, bool, str | None]:
    """``base`` carried on over the entries after its last one, or (None, a break already found,
    its last entry changed or gone, a stream end not readable as stored) a whole pass; and which;
    and, for a whole pass, the stored hash of ``anchor``'s entry (None: no entry there)."""
    # Only an intact chain: there each stream's entries have consecutive ``seq`` in position order,
    # so the stream's highest ``seq`` up to the mark is its latest entry, the one a whole pass links to.
    if base is not None and base.last is not None and base.breaks == 0:
        mark = base.last
        rows = _page(store, conn, _PAGE, _BYTES_PAGE, {"after": mark.position - 1, "n": 1})
        if rows and int(rows[0].position) == mark.position and rows[0].entry_hash == mark.entry_hash:

            def earlier(stream: str) -> tuple[int, str] | None:
                # The stream's last entry up to the mark, as stored.
                try:
                    row = conn.execute(_STREAM_END, {"stream": stream, "upto": mark.position}).first()
                except DBAPIError as exc:
                    if store.db.backend.classify(exc)[0] != "decode_failed":
                        raise  # the store's own handling (a lost connection is retried)
                    raise _StartOver from None
                if row is None:
                    return None
                if type(row[0]) is not int or type(row[1]) is not str:
                    raise _StartOver
                return row[0], row[1]

            # A new checker: the base stays as it was if this read is retried.
            checker = base.going_on(earlier)
            try:
                _check_from(store, conn, checker, None, None, 0)
                return checker, False, None
            except _StartOver:
                pass  # a value that is not UTF-8 (SQLite) does not end the read: on to a whole pass
    checker = _Checker()
    return checker, True, _check_from(store, conn, checker, anchor, None, 0)

def head(store: Store) -> Head | None:
    """The newest entry's position and hash (None for an empty journal): an anchor for ``verify``."""
    checked_store(store, "head")
    stmt = select(ev.c.position, ev.c.entry_hash).order_by(ev.c.position.desc()).limit(1)
    try:
        row = store.db.read(lambda conn: conn.execute(stmt).first())
    except DbFailure as exc:
        raise carry_failure(JournalError(failure_code(exc, "read_failed", closed="journal_closed"), "head",
                                         failure_detail("journal read", exc)), exc) from None
    return None if row is None else Head(position=int(row.position), entry_hash=row.entry_hash)
