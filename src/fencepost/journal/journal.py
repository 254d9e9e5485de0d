"""``store.journal``: fenced and unfenced appends, transactions, stream reads and the whole log.

Every write funnels into ``_append`` (the one append path). A fenced append asks the consensus
strategy's ``guard`` inside the same serialized write transaction as the insert, so no takeover can
commit between the check and the write (REFERENCE 3.2), and the guard runs before the idempotency
lookup: a displaced owner's retry is ``fence_lost`` even when its entry already exists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from fencepost._durable import DbFailure, carry_failure, failure_code, failure_detail
from fencepost._schema import flows_journal_events as ev
from fencepost._values import SAFE_MAX, identifier_problem, is_safe_int
from fencepost.errors import FencepostError, JournalError
from fencepost.journal import _append
from fencepost.journal._sql import ENTRY_COLUMNS
from fencepost.journal.consensus import CheckedConsensus, SqlConsensus, StrategyAnswerError
from fencepost.journal.entries import Accepted, Duplicate, EntriesPage, Entry, NewEntry
from fencepost.journal.entries import entry_from_row as _decode
from fencepost.journal.owner import OwnerId
from fencepost.journal.redaction import DEFAULT, Redaction
from fencepost.journal.replay import FACT_PREFIX, FACT_SOURCE

if TYPE_CHECKING:
    from fencepost._store import Store

T = TypeVar("T")

_RUN_STORE_COMPANION = "flows.companion/run-store/"

#: Largest ``limit`` one ``entries`` page may ask for (REFERENCE 3.1).
MAXIMUM_ENTRIES_LIMIT = 10_000
#: Most event types one ``entries`` filter may name.
MAXIMUM_EVENT_TYPES = 64

# Run ids, source ids, event types and owners repeat on every append; remember the valid ones.
_valid: set[object] = set()
_VALID_CACHE = 4096


def _id_problem(value: object) -> str | None:
    if type(value) is str and value in _valid:
        return None
    p = identifier_problem(value)
    if p is None:
        if len(_valid) >= _VALID_CACHE:
            _valid.clear()
        _valid.add(value)
    return p


def _owner_problem(owner: object) -> str | None:
    # A malformed fence is invalid input; a well-formed owner that holds nothing (including an
    # empty host or nonce, which no lease row can carry) is ``fence_lost`` (JF-04).
    if type(owner) is not OwnerId:
        return "must be an OwnerId"
    # msgspec does not check field types at construction: test them before hashing the triple.
    if (type(owner.pid) is int and type(owner.host_id) is str and type(owner.nonce) is str
            and (owner.host_id, owner.pid, owner.nonce) in _valid):
        return None
    if not is_safe_int(owner.pid):
        return "pid must be a non-negative safe integer"
    for name, value in (("host_id", owner.host_id), ("nonce", owner.nonce)):
        if type(value) is not str:
            return f"{name} must be a string"
        if value and identifier_problem(value):
            return f"{name} {identifier_problem(value)}"
    if len(_valid) >= _VALID_CACHE:
        _valid.clear()
    _valid.add((owner.host_id, owner.pid, owner.nonce))
    return None


_UNCHECKED = object()


def _entry_problem(event_type: object, source_seq: object) -> str | None:
    """Why one entry's own fields break the journal input contract (its stream's already passed)."""
    p = _id_problem(event_type)
    if p:
        return f"event_type {p}"
    if source_seq is not None and not (is_safe_int(source_seq) and source_seq < SAFE_MAX):
        return "source_seq must be a non-negative safe integer below 2**53 - 1"
    return None


class JournalTransaction:
    """The handle ``Journal.transact`` passes to its callable: appends that join one transaction.

    ``conn`` is the open write connection, for the caller's own statements; ``store.runs`` and
    ``store.attempts`` calls made inside the callable join the same transaction too. A refused
    append (``fence_lost``, ``idempotency_conflict``, ``invalid_event``) raises before it writes
    anything, so catching it leaves the transaction usable.
    """

    def __init__(self, journal: Journal, conn: Connection) -> None:
        self._journal = journal
        self.conn = conn

    def append(self, run_id: str, event_type: str, payload: Any, *, owner: OwnerId, source_id: str,
               source_seq: int | None = None, meta: Any = None, dedupe: str = "content") -> Accepted | Duplicate:
        """Fenced append inside this transaction (see ``Journal.append``)."""
        return self._run(run_id, [NewEntry(event_type, payload, meta, source_seq)], owner, source_id, dedupe,
                         "append", fenced=True)[0]

    def append_unfenced(self, run_id: str, event_type: str, payload: Any, *, source_id: str,
                        source_seq: int | None = None, meta: Any = None,
                        dedupe: str = "content") -> Accepted | Duplicate:
        """Unfenced append inside this transaction (see ``Journal.append_unfenced``)."""
        return self._run(run_id, [NewEntry(event_type, payload, meta, source_seq)], None, source_id, dedupe,
                         "append_unfenced", fenced=False)[0]

    def append_many(self, run_id: str, entries: Sequence[NewEntry], *, owner: OwnerId, source_id: str,
                    dedupe: str = "content") -> list[Accepted | Duplicate]:
        """Fenced multi-entry append inside this transaction (see ``Journal.append_many``)."""
        return self._run(run_id, entries, owner, source_id, dedupe, "append_many", fenced=True)

    def append_many_unfenced(self, run_id: str, entries: Sequence[NewEntry], *, source_id: str,
                             dedupe: str = "content") -> list[Accepted | Duplicate]:
        """Unfenced multi-entry append inside this transaction."""
        return self._run(run_id, entries, None, source_id, dedupe, "append_many_unfenced", fenced=False)

    def _run(self, run_id: str, entries: Sequence[NewEntry], owner: OwnerId | None, source_id: str, dedupe: str,
             method: str, *, fenced: bool) -> list[Accepted | Duplicate]:
        j = self._journal
        items, now = j._prepare(run_id, entries, owner, source_id, dedupe, method, fenced=fenced)
        return j._append_body(run_id, items, owner if fenced else None, source_id, dedupe, now, method, self.conn)


class Journal:
    """Append-only streams with fenced, idempotent appends, redacted on the write path.

    ``redaction`` (default ``fencepost.journal.redaction.DEFAULT``) scrubs every payload and meta
    before it is encoded; assign ``Redaction(rules=...)`` to replace the textual rules or
    ``Redaction.noop()`` to opt out explicitly. Identifiers (``run_id``, ``event_type``,
    ``source_id``, and so the derived ``event_id``) are stored verbatim, so one the redaction would
    rewrite is refused with ``invalid_event`` naming the field and the rule.
    """

    def __init__(self, store: Store, *, redaction: Redaction | None = None) -> None:
        self._store = store
        self.redaction = redaction if redaction is not None else DEFAULT

    @property
    def redaction(self) -> Redaction:
        """The ``Redaction`` applied to every payload and meta; it also vets identifiers."""
        return self._redaction

    @redaction.setter
    def redaction(self, value: Redaction) -> None:
        # A ``Redaction``, or a redactor object of the same shape: callable with a bool ``enabled``.
        if not isinstance(value, Redaction) and not (
            callable(value) and not isinstance(value, type) and type(getattr(value, "enabled", None)) is bool
        ):
            raise JournalError(
                "invalid_event", "redaction",
                "redaction must be a fencepost.journal.Redaction (Redaction(rules=...) or Redaction.noop())"
                " or a callable redactor object with a bool enabled attribute",
            )
        self._redaction = value
        self._clean_ids: set[str] = set()

    def _refuse_credential(self, field: str, value: str, method: str) -> None:
        """Refuse an identifier the journal's redaction would rewrite: it never reaches the table.

        Identifiers are not redacted (that would merge streams and break idempotency and the
        derived ``event_id``); they are refused with ``invalid_event`` naming the field and the
        rule that matched, never the value. ``Redaction.noop()`` opts out here too.
        """
        clean = self._clean_ids
        if value in clean:
            return
        r = self._redaction
        if not r.enabled:
            return
        if not isinstance(r, Redaction):
            r = DEFAULT  # a custom redactor object: identifiers are vetted by the built-in rules
        if r.text(value) != value:
            rule = next((x.id for x in r.rules if x.apply(value) != value), "textual rules")
            raise JournalError(
                "invalid_event", method,
                f"{field} looks like a credential (redaction rule {rule}); identifiers are stored verbatim,"
                " so credential-shaped ones are refused",
            )
        if len(clean) >= _VALID_CACHE:
            clean.clear()
        clean.add(value)

    # ------------------------------------------------------------------ the internal path
    def append_in(
        self,
        conn: Connection,
        run_id: str,
        event_type: str,
        payload: Any,
        *,
        source_id: str,
        source_seq: int | None = None,
        meta: Any = None,
        dedupe: str = "content",
    ) -> Accepted | Duplicate:
        """Append inside the caller's open write transaction (``conn`` from ``store.db.write``).

        Internal path shared by companion facts and the public appends, so there is one append
        path. Identifiers must already be validated; redaction and the durable-value check of
        payload and meta are applied here. The run store's own consensus facts keep their
        structural fields verbatim (``Redaction.fact``).
        """
        if not isinstance(conn, Connection):
            raise JournalError("invalid_event", "append_in", "conn must be the Connection of an open store.db.write")
        redact = self._redactor()
        if redact is not None and source_id == FACT_SOURCE and event_type.startswith(FACT_PREFIX):
            redact = self.redaction.fact
        return _append.append(
            conn,
            run_id=run_id,
            event_type=event_type,
            payload=payload,
            source_id=source_id,
            source_seq=source_seq,
            meta=meta,
            dedupe=dedupe,
            emitted_at_ms=self._now("append"),
            redact=redact,
        )

    def _redactor(self) -> Callable[[Any], Any] | None:
        r = self._redaction
        return r if r.enabled else None

    def _now(self, method: str) -> int:
        now = self._store.clock.now_ms()
        if not is_safe_int(now):
            raise JournalError("invalid_event", method, "clock reading must be a non-negative safe integer")
        return now

    def _prepare(self, run_id: str, entries: Sequence[NewEntry], owner: OwnerId | None, source_id: str,
                 dedupe: str, method: str, *, fenced: bool) -> tuple[list[tuple[str, str, str, int | None]], int]:
        # Everything that can refuse an entry runs here, before the transaction allocates anything.
        if fenced:
            p = _owner_problem(owner)
            if p:
                raise JournalError("invalid_event", method, f"{method} requires a well-formed owner fence ({p})")
        if type(entries) not in (list, tuple) or not entries:
            raise JournalError("invalid_event", method, "entries must be a non-empty list")
        # The stream's fields once, then each entry's own (``_entry_problem``). Identifiers already
        # found valid (``_id_problem``'s cache) are not asked again: an append repeats them.
        valid = _valid
        p = None
        if not (type(run_id) is str and run_id in valid and type(source_id) is str and source_id in valid):
            for name, value in (("run_id", run_id), ("source_id", source_id)):
                problem = _id_problem(value)
                if problem:
                    p = f"{name} {problem}"
                    break
        if p is None and dedupe != "content" and dedupe != "identity":
            p = "dedupe must be 'content' or 'identity'"
        if p:
            raise JournalError("invalid_event", method, f"event violates the journal input contract: {p}")
        if run_id.startswith(_RUN_STORE_COMPANION):
            # Only the run store writes its companion stream (inside the mutation's transaction):
            # a public append there could forge ownership facts an auditor replays.
            raise JournalError("invalid_event", method, "run_id is the run store's reserved companion stream")
        clean = self._clean_ids
        if run_id not in clean:
            self._refuse_credential("run_id", run_id, method)
        if source_id not in clean:
            self._refuse_credential("source_id", source_id, method)
        r = self._redaction
        redact = r if r.enabled else None  # ``_redactor()``, inline
        prepare = _append.prepare
        checked_type: object = _UNCHECKED  # the event type checked last: a batch's entries mostly share one
        items = []
        for e in entries:
            if type(e) is not NewEntry:
                raise JournalError("invalid_event", method, "entries must be NewEntry values")
            event_type, source_seq = e.event_type, e.source_seq
            if event_type is not checked_type or source_seq is not None:
                if source_seq is not None or type(event_type) is not str or event_type not in valid:
                    p = _entry_problem(event_type, source_seq)
                    if p:
                        raise JournalError("invalid_event", method, f"event violates the journal input contract: {p}")
                if event_type not in clean:
                    self._refuse_credential("event_type", event_type, method)
                checked_type = event_type
            meta = e.meta
            items.append((event_type, prepare(e.payload, "payload", redact, method),
                          "{}" if meta is None else prepare(meta, "meta", redact, method), source_seq))
        return items, self._now(method)

    def _append_body(self, run_id: str, items: list[tuple[str, str, str, int | None]], owner: OwnerId | None,
                     source_id: str, dedupe: str, now: int, method: str,
                     conn: Connection) -> list[Accepted | Duplicate]:
        # ``conn`` last: ``_run`` binds the rest with ``partial``, which costs less than a closure
        # over all of them.
        heads = None
        if owner is not None:
            consensus = self._store.consensus
            if type(consensus) is SqlConsensus:
                # The built-in strategy answers the fence check and the heads in one statement.
                held, heads = consensus.guard_and_heads(conn, run_id, owner, source_id)
            else:
                held = self._ask_guard(consensus, conn, run_id, owner, method)
            if not held:
                raise JournalError("fence_lost", method, "owner does not hold the run")
        return _append.append_prepared(
            conn, run_id=run_id, source_id=source_id, emitted_at_ms=now, items=items, dedupe=dedupe, method=method,
            heads=heads,
        )

    @staticmethod
    def _ask_guard(consensus: Any, conn: Connection, run_id: str, owner: OwnerId, method: str) -> bool:
        """An injected strategy's ``guard``, its answer checked; its failures never carry its text."""
        failure = None
        try:
            return CheckedConsensus(consensus).guard(conn, run_id, owner)
        except JournalError:
            raise
        except FencepostError as err:
            if err.code != "fence_lost":
                raise
            return False  # a strategy that raises fence_lost instead of answering False
        except (SQLAlchemyError, DbFailure):
            raise  # the database's own failure: the write maps it (sink_failed) or retries
        except StrategyAnswerError as exc:
            failure = str(exc)  # names the method and types only
        except Exception as exc:
            failure = f"consensus strategy {type(consensus).__name__}.guard raised {type(exc).__name__}"
        # Raised outside the handler: the strategy's exception (its text may quote values) is
        # neither the cause nor the context.
        raise JournalError("persistence_failed", method, failure)

    def _write(self, body: Callable[[Connection], T], method: str) -> T:
        try:
            return self._store.db.write(body)
        except DbFailure as exc:
            code = failure_code(exc, "sink_failed", closed="journal_closed")
            err = carry_failure(JournalError(code, method, failure_detail("journal write", exc)), exc)
            err.cause_code = exc.category  # type: ignore[attr-defined]
            raise err from None

    # ------------------------------------------------------------------ public appends
    def append(self, run_id: str, event_type: str, payload: Any, *, owner: OwnerId, source_id: str,
               source_seq: int | None = None, meta: Any = None, dedupe: str = "content") -> Accepted | Duplicate:
        """Append one entry to stream ``run_id`` while ``owner`` holds the run.

        Commits only if ``store.consensus.guard`` admits ``owner`` inside the same write
        transaction; otherwise ``JournalError("fence_lost")`` and nothing is written, even when
        an entry with this identity already exists (the fence outranks dedup). ``seq`` is the next
        in the stream, gapless; ``source_seq`` defaults to the producer's next. An existing
        ``(run_id, source_id, source_seq)`` gives ``Duplicate`` (same content, or any content with
        ``dedupe="identity"``) or ``idempotency_conflict``. Payload and meta are redacted first;
        bad input is ``invalid_event`` naming the field, never the value, and is refused before
        a sequence is allocated.
        """
        return self._run(run_id, [NewEntry(event_type, payload, meta, source_seq)], owner, source_id, dedupe,
                         "append", fenced=True)[0]

    def append_unfenced(self, run_id: str, event_type: str, payload: Any, *, source_id: str,
                        source_seq: int | None = None, meta: Any = None,
                        dedupe: str = "content") -> Accepted | Duplicate:
        """Append one entry with no owner check: admissions that have no owner (imports, sweepers)."""
        return self._run(run_id, [NewEntry(event_type, payload, meta, source_seq)], None, source_id, dedupe,
                         "append_unfenced", fenced=False)[0]

    def append_many(self, run_id: str, entries: Sequence[NewEntry], *, owner: OwnerId, source_id: str,
                    dedupe: str = "content") -> list[Accepted | Duplicate]:
        """Append ``entries`` to one stream in one transaction while ``owner`` holds the run.

        All or nothing: one refused entry refuses the batch. Receipts in input order; an identity
        repeated inside the batch is a ``Duplicate`` of its first occurrence. One multi-row insert.
        """
        return self._run(run_id, entries, owner, source_id, dedupe, "append_many", fenced=True)

    def append_many_unfenced(self, run_id: str, entries: Sequence[NewEntry], *, source_id: str,
                             dedupe: str = "content") -> list[Accepted | Duplicate]:
        """``append_many`` without the owner check."""
        return self._run(run_id, entries, None, source_id, dedupe, "append_many_unfenced", fenced=False)

    def _run(self, run_id: str, entries: Sequence[NewEntry], owner: OwnerId | None, source_id: str, dedupe: str,
             method: str, *, fenced: bool) -> list[Accepted | Duplicate]:
        items, now = self._prepare(run_id, entries, owner, source_id, dedupe, method, fenced=fenced)
        fence = owner if fenced else None
        return self._write(partial(self._append_body, run_id, items, fence, source_id, dedupe, now, method), method)

    def transact(self, fn: Callable[[JournalTransaction], T]) -> T:
        """Run ``fn(tx)`` in one write transaction and commit its journal entries with its other writes.

        ``tx.append``/``tx.append_unfenced``/``tx.append_many`` append inside it, ``tx.conn`` runs the
        caller's own statements, and ``store.runs``/``store.attempts`` calls made inside ``fn`` join
        it. Everything commits together or, if ``fn`` raises, nothing does.
        """
        if not callable(fn):
            raise JournalError("invalid_event", "transact", "fn must be a callable taking a JournalTransaction")
        return self._write(lambda conn: fn(JournalTransaction(self, conn)), "transact")

    # ------------------------------------------------------------------ reads
    def entries(self, run_id: str, after: int | None = None, event_types: Iterable[str] | None = None,
                limit: int = 1000) -> EntriesPage:
        """Read stream ``run_id`` (a run id or a companion stream id) in ``seq`` order.

        ``after`` excludes ``seq <= after`` (None or -1: from the start); ``event_types`` filters
        (at most 64); ``limit`` is 1..10 000. ``has_more`` says a later page exists.
        """
        p = identifier_problem(run_id)
        if p:
            raise JournalError("invalid_event", "entries", f"run_id {p}")
        if after is not None and not (type(after) is int and -1 <= after <= SAFE_MAX):
            raise JournalError("invalid_event", "entries", "after must be None or a safe integer >= -1")
        if not (type(limit) is int and 1 <= limit <= MAXIMUM_ENTRIES_LIMIT):
            raise JournalError("invalid_event", "entries", f"limit must be an integer in 1..{MAXIMUM_ENTRIES_LIMIT}")
        types: list[str] | None = None
        if event_types is not None:
            if isinstance(event_types, str):
                raise JournalError("invalid_event", "entries", "event_types must be a collection of strings")
            try:
                types = list(event_types)
            except TypeError:
                raise JournalError("invalid_event", "entries", "event_types must be a collection of strings") from None
            if len(types) > MAXIMUM_EVENT_TYPES:
                raise JournalError("invalid_event", "entries", f"event_types holds more than {MAXIMUM_EVENT_TYPES}")
            for t in types:
                tp = identifier_problem(t)
                if tp:
                    raise JournalError("invalid_event", "entries", f"event_types member {tp}")
        stmt = select(*ENTRY_COLUMNS).where(ev.c.run_id == run_id)
        if after is not None:
            stmt = stmt.where(ev.c.seq > after)
        if types is not None:
            if not types:
                return EntriesPage(entries=[], has_more=False)
            stmt = stmt.where(ev.c.event_type.in_(types))
        stmt = stmt.order_by(ev.c.seq).limit(limit + 1)
        rows = self._read(lambda conn: conn.execute(stmt).all(), "entries")
        return EntriesPage(entries=[_decode(r, "entries") for r in rows[:limit]], has_more=len(rows) > limit)

    def log(self, after: int = 0, *, page_size: int = 1000) -> Iterator[Entry]:
        """Iterate over the whole journal in global ``position`` order, from ``position > after``.

        Positions are allocated in commit order under the writer lock, so paging on ``position``
        never skips an entry that commits while the iterator runs; it ends at the log's head as of
        its last page.
        """
        if not (type(after) is int and 0 <= after <= SAFE_MAX):
            raise JournalError("invalid_event", "log", "after must be a non-negative safe integer")
        if not (type(page_size) is int and 1 <= page_size <= MAXIMUM_ENTRIES_LIMIT):
            raise JournalError("invalid_event", "log", f"page_size must be an integer in 1..{MAXIMUM_ENTRIES_LIMIT}")
        while True:
            rows = self._read(partial(_log_page, after=after, n=page_size), "log")
            for r in rows:
                yield _decode(r, "log")
            if len(rows) < page_size:
                return
            after = int(rows[-1].position)

    def _read(self, fn: Callable[[Connection], T], method: str) -> T:
        try:
            return self._store.db.read(fn)
        except DbFailure as exc:
            raise carry_failure(JournalError(failure_code(exc, "read_failed", closed="journal_closed"), method,
                                             failure_detail("journal read", exc)),
                                exc) from None


_LOG_PAGE = (
    select(*ENTRY_COLUMNS).where(ev.c.position > bindparam("after")).order_by(ev.c.position).limit(bindparam("n"))
)


def _log_page(conn: Connection, *, after: int, n: int) -> Sequence[Any]:
    """One page of ``Journal.log``: up to ``n`` rows past position ``after``."""
    return conn.execute(_LOG_PAGE, {"after": after, "n": n}).all()
