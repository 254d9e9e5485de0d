"""What each console page shows, read from the store with the library's public reads.

Plain functions of a read-only ``Store`` returning plain values for the templates (and JSON for the
live ``stats`` event). Nothing here writes. Everything a run carries that could hold a credential
(its state, attempt checkpoints, errors and outcomes, a failure reason, cancellation
acknowledgements) passes through the journal's own default ``Redaction`` first, so the console
shows what the journal would have stored, never more.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlencode

import msgspec
from sqlalchemy import func, select

from fencepost._durable import DbFailure, map_failure
from fencepost._schema import flows_runs
from fencepost._values import SAFE_MAX, ascii_digits, is_safe_int
from fencepost.errors import FencepostError, PersistenceError, RunStoreError
from fencepost.journal.redaction import Redaction, RedactionError
from fencepost.journal.verify import Resumable, log_page

if TYPE_CHECKING:
    from fencepost._store import Store
    from fencepost.ui.hub import FeedHub

STATUSES = ("pending", "running", "suspended", "completed", "failed", "cancelled")
PAGE_SIZE = 50
_redaction = Redaction()
_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_FACT_PREFIX = "flows.consensus."


class BadInput(Exception):
    """A query parameter the console refuses: ``code`` is the library's error code, ``detail`` the rule."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


# ----------------------------------------------------------------------------- formatting
def when(ms: int | None) -> str:
    """A millisecond stamp as UTC ISO time."""
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, OSError, ValueError):
        return str(ms)


def owner_text(owner: Any) -> str:
    if owner is None:
        return "-"
    return f"{owner.host_id}/{owner.pid}/{owner.nonce[:8]}"


def redacted(value: Any) -> Any:
    """The journal's default redaction of a JSON-like value (a refusal shows as a marker, never the value)."""
    try:
        return _redaction(value)
    except RedactionError:
        return "[not shown: the value cannot be redacted]"


def redacted_json_text(text: str | None) -> str:
    """Decode JSON text, redact it, pretty-print it; text that is not JSON gets the textual rules."""
    if text is None:
        return "-"
    try:
        value = _decoder.decode(text)
    except msgspec.DecodeError:
        return _redaction.text(text)
    return pretty(redacted(value))


def flow_text(flow_name: str | None) -> str | None:
    """A run's flow name (its state's ``flowName``) with the journal's textual redaction applied."""
    return None if flow_name is None else _redaction.text(flow_name)


def pretty(value: Any) -> str:
    return msgspec.json.format(_encoder.encode(value), indent=2).decode()


# ----------------------------------------------------------------------------- runs listing
#: A ``+HH:MM`` offset typed into an address bar arrives as `` HH:MM`` (``+`` is a space in a query).
_PLUS_AS_SPACE = re.compile(r"^(.*[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?) (\d{2}:?\d{2})$", re.ASCII)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)?(?:Z|[+-]\d{2}:?\d{2})?", re.ASCII)


def _instant(name: str, text: str) -> int:
    """``created_after`` / ``created_before``: milliseconds, or an ISO date/time (UTC unless it names an offset).

    Checked here against the store's range (0 .. 2**53 - 1 ms, from 1970 on), so that a refusal
    names the query parameter, not the listing filter behind it.
    """
    text = _PLUS_AS_SPACE.sub(r"\1+\2", text.strip())
    if ascii_digits(text, 16):
        ms = int(text)
    elif not _DATE.fullmatch(text):
        raise BadInput("invalid_options", f"{name} must be milliseconds or an ISO date/time")
    else:
        try:
            parsed = datetime.fromisoformat(text.removesuffix("Z"))
        except ValueError:
            raise BadInput("invalid_options", f"{name} must be milliseconds or an ISO date/time") from None
        # UTC unless it names an offset, as ``runs list --created-after`` reads it.
        ms = int((parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp() * 1000)
    if not is_safe_int(ms):
        raise BadInput("invalid_options", f"{name} must be from 1970-01-01 on and at most {SAFE_MAX} milliseconds")
    return ms


#: The query parameters a page may be given more than once: ``status`` (the listing filters by several).
REPEATABLE = frozenset({"status"})
#: The parameters of the runs page.
RUNS_PARAMETERS = ("status", "flow", "created_after", "created_before", "limit", "cursor")


def given_once(query: Mapping[str, str], names: tuple[str, ...]) -> None:
    """Refuse a parameter among ``names`` given more than once (a browser would not say which value
    counts): ``invalid_options`` naming it. ``status`` may be repeated."""
    getlist = getattr(query, "getlist", None)
    if getlist is None:
        return
    for name in names:
        n = len(getlist(name))
        if n > 1 and name not in REPEATABLE:
            raise BadInput("invalid_options", f"{name} is given more than once ({n} times): give it once")


def statuses_of(query: Mapping[str, str]) -> list[str]:
    """The ``status`` values of a query, in order, each once, blanks ("any") left out."""
    getlist = getattr(query, "getlist", None)
    values = getlist("status") if getlist is not None else [query.get("status", "")]
    return list(dict.fromkeys(v for v in values if v))


def listing_filters(query: Mapping[str, str]) -> dict[str, Any]:
    """The listing filters of a runs-page query: ``status`` (one or several), ``flow``,
    ``created_after``, ``created_before``."""
    filters: dict[str, Any] = {}
    statuses = statuses_of(query)
    if statuses:
        filters["status"] = statuses[0] if len(statuses) == 1 else statuses
    if query.get("flow"):
        filters["flow_name"] = query["flow"]
    for key, name in (("created_after", "created_after_ms"), ("created_before", "created_before_ms")):
        if query.get(key):
            filters[name] = _instant(key, query[key])
    return filters


def _limit(query: Mapping[str, str]) -> int:
    if query.get("limit"):
        text = query["limit"]
        if not ascii_digits(text, 4):
            raise BadInput("invalid_options", "limit must be an integer in 1..200")
        return int(text)
    return PAGE_SIZE


def _bad_listing(exc: RunStoreError) -> BadInput | None:
    if exc.code in ("invalid_options", "invalid_cursor") or type(exc).__name__ == "SourceChanged":
        return BadInput(exc.code if exc.code != "invalid_run" else "source_changed", exc.detail)
    return None


def _row(r: Any) -> dict[str, Any]:
    return {
        "run_id": r.run_id, "status": r.status, "flow": flow_text(r.flow_name) or "-", "owner": owner_text(r.owner),
        "created": when(r.created_at_ms), "created_ms": r.created_at_ms,
        "started": when(r.started_at_ms), "finished": when(r.finished_at_ms),
        "cancel": "requested" if r.cancellation is not None else "-",
        "lineage": r.lineage_id if r.lineage_id != r.run_id else "-", "round": r.round_ordinal,
        "revision": r.revision,
    }


def _queries(query: Mapping[str, str], cursor: str | None) -> dict[str, Any]:
    given: dict[str, Any] = {k: query.get(k, "") for k in ("flow", "created_after", "created_before", "limit")}
    given["status"] = statuses_of(query)
    kept = {k: v for k, v in given.items() if v}
    return {"filters": given, "first_query": urlencode(kept, doseq=True),
            "next_query": urlencode({**kept, "cursor": cursor}, doseq=True) if cursor else None}


def runs_page(store: Store, query: Mapping[str, str]) -> dict[str, Any]:
    """One newest-first page of the listing with the filters and cursor of ``query``."""
    given_once(query, RUNS_PARAMETERS)
    filters = listing_filters(query)
    cursor = query.get("cursor") or None
    limit = _limit(query)
    try:
        page = store.feed.list_runs(filters or None, cursor, limit, newest_first=True)
    except RunStoreError as exc:
        bad = _bad_listing(exc)
        if bad is not None:
            raise bad from None
        raise
    rows = [_row(r) for r in page.runs]
    return {"rows": rows, "cursor": page.cursor, "revision": page.revision, "source": page.source,
            "first_page": cursor is None, "filtered": bool(filters), **_queries(query, page.cursor)}


def runs_page_across(stores: Mapping[str, Store], query: Mapping[str, str],
                     down: Collection[str] = ()) -> dict[str, Any]:
    """One newest-first page of the listing merged across named stores, each row labelled ``store``.

    The merge is the CLI's (``runs list`` across stores): each store listed with its own keyset
    cursor, merged by (created, run id, store), the next cursor holding each store's position.
    The stores named in ``down`` (not answering) are left out; the next cursor keeps each one's
    place as it was (or none, for one not listed yet), so that once it answers again the pages
    after this one list its runs from there: none is skipped, though they come late.
    """
    from fencepost.changefeed.cursor import decode_across, encode_across
    from fencepost.changefeed.merged import merged_page

    given_once(query, RUNS_PARAMETERS)
    filters = listing_filters(query)
    cursor = query.get("cursor") or None
    limit = _limit(query)
    if not 1 <= limit <= 200:  # one store's list_runs checks this; here every store is asked for limit
        raise BadInput("invalid_options", "limit must be an integer in 1..200")
    up = {name: store for name, store in stores.items() if name not in down}
    try:
        held: dict[str, str | None] = {}
        if down and cursor is not None:
            after = decode_across(cursor, list(stores))
            held = {name: after.pop(name) for name in down if name in after}
            cursor = encode_across(after)
        shown, next_cursor = merged_page(up, filters, cursor, limit, True)
    except RunStoreError as exc:
        bad = _bad_listing(exc)
        if bad is not None:
            raise bad from None
        raise
    if down:
        resume = decode_across(next_cursor, list(up)) if next_cursor else dict.fromkeys(up)
        resume.update(held)
        more = any(v is not None for v in resume.values()) or any(name not in resume for name in down)
        next_cursor = encode_across(resume) if more else None
    rows = [{"store": name, **_row(r)} for name, r in shown]
    return {"rows": rows, "cursor": next_cursor, "first_page": query.get("cursor") is None,
            "filtered": bool(filters), **_queries(query, next_cursor)}


def down_part(store: Store, code: str) -> dict[str, Any]:
    """What the console says of a store that does not answer: its error code and its database
    (the URL's password hidden), never the error's text; for a store refused when it opened late,
    code ``refused`` and the refusal (``detail``: the start-up's message, which holds no value)."""
    from fencepost._durable import parse_url, redact_url
    from fencepost.ui.awaited import refusal

    # The backend is the URL's: a store the console waits for has no database object yet.
    part = {"error": code, "database": redact_url(store.url), "backend": parse_url(store.url)[0].get_backend_name()}
    refused = refusal(store)
    if refused is not None:  # refused once it answered: why, as the start-up would have said
        part["error"], part["detail"] = "refused", refused
    return part


def each_store(stores: Mapping[str, Store], read: Callable[[str, Store], Any], none_answering: bool = False,
               known_down: Mapping[str, str] | None = None,
               failures: dict[str, FencepostError] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``read(name, store)`` of every store: ``(answers, down)``, ``down`` holding ``down_part`` of
    each store whose read failed with the store's own error. Raises the first failure when no
    store answers (there is nothing to show then), unless ``none_answering``.

    ``known_down`` (name: error code) are stores the console already knows do not answer: they are
    not read, so that a page does not wait on a server that is not there (a connection refused
    is retried for seconds) for every request.

    ``failures``, when given, receives each store's failure (name: error), to tell an outage from
    a store that answered wrongly.
    """
    answers: dict[str, Any] = {}
    down: dict[str, Any] = {}
    first: FencepostError | None = None
    for name, store in stores.items():
        if known_down and name in known_down:
            down[name] = down_part(store, known_down[name])
            failed: FencepostError = PersistenceError(known_down[name], "console", "the store does not answer")
        else:
            try:
                answers[name] = read(name, store)
                continue
            except FencepostError as exc:
                down[name] = down_part(store, exc.code)
                failed = exc
        first = first or failed
        if failures is not None:
            failures[name] = failed
    if first is not None and not answers and not none_answering:
        raise first
    return answers, down


@contextlib.contextmanager
def store_reads(subject: str) -> Iterator[None]:
    """Reads the console makes on a store's database itself (not through a store method) fail as the
    store's own do: a ``PersistenceError`` with the error code, which the pages and the event stream
    report, never the plumbing's ``DbFailure`` (a 500 ``internal_error`` with a traceback)."""
    try:
        yield
    except DbFailure as exc:
        raise map_failure(exc, PersistenceError, "console", subject) from None


def status_counts(store: Store) -> dict[str, int]:
    """How many runs are in each status (one grouped read of the run table)."""
    stmt = select(flows_runs.c.status, func.count()).group_by(flows_runs.c.status)
    with store_reads("status counts"):
        found = dict(store.db.read(lambda conn: [tuple(r) for r in conn.execute(stmt)]))
    return {s: int(found.get(s, 0)) for s in STATUSES}


def status_counts_across(stores: Mapping[str, Store]) -> dict[str, int]:
    """Each status's count summed over every store."""
    return _summed(status_counts(store) for store in stores.values())


def _summed(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total = dict.fromkeys(STATUSES, 0)
    for each in counts:
        for status, n in each.items():
            total[status] += n
    return total


# ----------------------------------------------------------------------------- one run
#: The newest ownership facts a run's page reads and draws (its status history, its timeline). A
#: run claimed and abandoned ten thousand times has twenty thousand of them: the page says how
#: many there are and where to read them all (``fencepost journal show <id> --companion``).
#: Replay's verdict still covers every fact.
FACTS_SHOWN = 500
#: The violations the verdict lists (it counts every one).
VIOLATIONS_LISTED = 100


class Unreadable(msgspec.Struct, frozen=True):
    """A journal entry the journal cannot decode (edited by hand): where it is and what cannot be
    decoded, never what it holds. ``seq`` and ``emitted_at_ms`` are None when not integers."""

    position: int
    seq: int | None
    emitted_at_ms: int | None
    detail: str


def readable(row: Any, method: str) -> Any:
    """A stored journal row (``stream_page`` / ``log_page``) as its ``Entry``, or as ``Unreadable``
    when the journal cannot decode it (as ``fencepost journal show`` shows such an entry)."""
    from fencepost.journal.verify import decoded

    entry, detail = decoded(row, method)
    if detail is None:
        return entry
    return Unreadable(position=int(row.position), seq=row.seq if is_safe_int(row.seq) else None,
                      emitted_at_ms=row.emitted_at_ms if is_safe_int(row.emitted_at_ms) else None, detail=detail)


class Facts(msgspec.Struct, frozen=True):
    """The newest ownership facts of a run (``shown``: ``Entry`` or ``Unreadable``, in ``seq``
    order) and how many entries its companion stream holds (``total``)."""

    shown: list[Any]
    total: int

    @property
    def bounded(self) -> bool:
        return self.total > len(self.shown)


def _companion_facts(store: Store, run_id: str, limit: int | None = None) -> Facts:
    """The newest ``limit`` (``FACTS_SHOWN``) entries of the run's companion stream that are facts,
    or that cannot be decoded; two statements: the stream's size and newest seq, then that page."""
    from fencepost._schema import flows_journal_events as ev
    from fencepost.journal import companion_stream
    from fencepost.journal.replay import FACT_SOURCE
    from fencepost.journal.verify import stream_page

    limit = FACTS_SHOWN if limit is None else limit
    stream = companion_stream(run_id)
    stmt = select(func.count(), func.max(ev.c.seq)).where(ev.c.run_id == stream)
    with store_reads("ownership facts"):
        total, newest = store.db.read(lambda conn: tuple(conn.execute(stmt).one()))
    # A seq stored by hand past the table's types (SQLite) says nothing of where the newest are:
    # the first page then, still bounded.
    after = max(-1, newest - limit) if is_safe_int(newest) else -1
    shown = []
    for row in stream_page(store, stream, after, limit):
        e = readable(row, "entries")
        if type(e) is Unreadable or (e.event_type.startswith(_FACT_PREFIX) and e.source_id == FACT_SOURCE):
            shown.append(e)
    return Facts(shown=shown, total=int(total or 0))


def status_history(row: Any, facts: list[Any]) -> list[dict[str, Any]]:
    """What the row's stamps and the ownership facts prove about the run's status, oldest first.

    The store keeps no per-status log: ``created``, ``started``, ``finished`` and the cancellation
    stamps come from the row; claims, activations (status ``running``), steals, expiries and
    releases from the run's ownership facts.
    """
    items: list[dict[str, Any]] = [{"at": row.created_at_ms, "what": "created", "status": "pending", "by": "-"}]
    labels = {"claimed": ("claimed", None), "activated": ("activated", "running"), "stolen": ("stolen", None),
              "expired": ("claim expired", None), "released": ("released", None)}
    at = row.created_at_ms
    for e in facts:
        if type(e) is Unreadable:
            # Where it stands in the stream (its time, when even that cannot be read, is the
            # previous fact's), and what cannot be decoded, never what it holds.
            at = e.emitted_at_ms if e.emitted_at_ms is not None else at
            items.append({"at": at, "what": f"the entry at position {e.position} cannot be decoded ({e.detail})",
                          "status": "", "by": "-", "seq": e.seq if e.seq is not None else -1,
                          "undecodable": True, "known": e.emitted_at_ms is not None})
            continue
        at = e.emitted_at_ms
        kind = e.event_type[len(_FACT_PREFIX):]
        what, status = labels.get(kind, (kind, None))
        owner = e.payload.get("owner") if isinstance(e.payload, dict) else None
        by = (f"{owner.get('hostId')}/{owner.get('pid')}/{str(owner.get('nonce'))[:8]}"
              if isinstance(owner, dict) else "-")
        items.append({"at": e.emitted_at_ms, "what": what, "status": status or "", "by": by, "seq": e.seq})
    if row.cancel_requested_at_ms is not None:
        items.append({"at": row.cancel_requested_at_ms, "what": "cancellation requested", "status": "", "by": "-"})
    ack = row.cancel_acknowledgement
    if isinstance(ack, dict) and isinstance(ack.get("observedAtMs"), int):
        items.append({"at": ack["observedAtMs"], "what": "cancellation acknowledged", "status": "", "by": "owner"})
    if row.finished_at_ms is not None:
        items.append({"at": row.finished_at_ms, "what": "settled", "status": row.status, "by": "-"})
    items.sort(key=lambda i: (i["at"], i.get("seq", -1)))
    for i in items:
        i["when"] = when(i["at"]) if i.get("known", True) else "-"
    return items


def _drawn(history: Any, facts: Facts) -> Any:
    """What the timeline and the tenure table draw of ``history``: everything, unless the page shows
    only the newest facts; then the tenures and violations from the oldest fact shown on (a tenure
    still open, or ending there, included), at most ``FACTS_SHOWN`` of each."""
    if not facts.bounded or not facts.shown:
        return history
    since = facts.shown[0].position
    intervals = [i for i in history.intervals if i.end_position is None or i.end_position >= since]
    violations = [v for v in history.violations if v.position >= since]
    return msgspec.structs.replace(history, intervals=intervals[-FACTS_SHOWN:], violations=violations[-FACTS_SHOWN:])


def _warnings(store: Store, run_id: str) -> list[Any]:
    """The run's ``lease-reconfirmed`` warnings. When an entry of the run's own stream cannot be
    decoded (edited by hand), the stream is read again entry by entry and that entry passed over
    (the journal page and ``journal verify`` name it): the page is not refused for it."""
    from fencepost.journal.verify import stream_page
    from fencepost.runstore._reading import reconfirm_warning, reconfirm_warnings

    try:
        return reconfirm_warnings(store, run_id)
    except FencepostError as exc:
        if exc.code != "decode_failed":
            raise
    warnings: list[Any] = []
    after = -1
    while True:
        rows = stream_page(store, run_id, after, 1000)
        for row in rows:
            e = readable(row, "entries")
            warning = None if type(e) is Unreadable else reconfirm_warning(e)
            if warning is not None:
                warnings.append(warning)
        if len(rows) < 1000 or not is_safe_int(rows[-1].seq):
            return warnings
        after = rows[-1].seq


def failure_view(failure: Any) -> list[tuple[str, str]] | None:
    """The run's failure record (when its row has one) as ``(field, text)`` pairs, every text redacted."""
    if failure is None:
        return None
    fields = msgspec.to_builtins(failure)
    if not isinstance(fields, dict):
        return [("reason", redacted_json_text(_encoder.encode(fields).decode()))]
    return [(str(k), _redaction.text(v) if isinstance(v, str) else pretty(redacted(v)))
            for k, v in fields.items() if v is not None]


def run_detail(store: Store, run_id: str) -> dict[str, Any] | None:
    """Everything the run page shows, or None for an unknown (or malformed) run id."""
    from fencepost.journal import ownership_history
    from fencepost.ui.timeline import render_timeline

    try:
        row = store.runs.get(run_id)
    except RunStoreError as exc:
        if exc.code in ("not_found_row", "invalid_run"):
            return None
        raise
    facts = _companion_facts(store, run_id)
    # Replay's verdict needs every fact from the first (it is the library's one pass over the
    # stream, as ``journal replay`` makes it); only what the page draws is bounded.
    history = ownership_history(store, run_id)
    warnings = _warnings(store, run_id)
    drawn = _drawn(history, facts)
    attempts = [{
        "step": a.step_key_digest, "attempt": a.attempt, "state": a.state, "started": when(a.started_at_ms),
        "finished": when(a.finished_at_ms), "heartbeat": when(a.heartbeat_at_ms),
        "checkpoint": pretty(redacted(a.checkpoint)) if a.checkpoint is not None else "-",
        "error": pretty(redacted(a.error)) if a.error is not None else "-",
        "outcome": pretty(redacted(a.outcome)) if a.outcome is not None else "-",
    } for a in store.attempts.of_run(run_id, limit=200)]
    lineage = [{"run_id": r.run_id, "round": r.round_ordinal if r.round_ordinal is not None else 0,
                "status": r.status, "created": when(r.created_at_ms), "current": r.run_id == run_id}
               for r in store.runs.lineage(run_id)]
    failure = failure_view(getattr(row, "failure", None))
    ack = row.cancel_acknowledgement
    now = store.clock.now_ms()
    return {
        "row": row,
        "state": redacted_json_text(row.state_json),
        "fields": [
            ("status", row.status), ("created", when(row.created_at_ms)), ("started", when(row.started_at_ms)),
            ("finished", when(row.finished_at_ms)), ("heartbeat", when(row.heartbeat_at_ms)),
            ("owner", owner_text(row.owner)), ("claimant", owner_text(row.claimant)),
            ("claimed", when(row.claimed_at_ms)), ("parent", row.parent_run_id or "-"),
            ("lineage / round", f"{row.lineage_id or row.run_id} / {row.round_ordinal or 0}"),
        ],
        "cancellation": None if row.cancel_requested_at_ms is None else {
            "requested": when(row.cancel_requested_at_ms),
            "acknowledgement": pretty(redacted(ack)) if ack is not None else None,
        },
        "failure": failure,
        "history": status_history(row, facts.shown),
        "facts_shown": len(facts.shown), "facts_total": facts.total, "facts_bounded": facts.bounded,
        "companion_command": f"fencepost journal show {shlex.quote(run_id)} --companion",
        "violations_listed": history.violations[:VIOLATIONS_LISTED],
        "attempts": attempts,
        "lineage": lineage,
        "replay": history,
        "intervals": [{
            "owner": owner_text(i.owner), "started": when(i.started_at_ms), "ended": when(i.ended_at_ms),
            "ended_by": i.ended_by or "still held", "from_seq": i.start_seq, "to_seq": i.end_seq,
        } for i in drawn.intervals],
        "intervals_total": len(history.intervals),
        "warnings": warnings,
        "timeline": render_timeline(row, [e for e in facts.shown if type(e) is not Unreadable], drawn, warnings,
                                    now, bounded=facts.bounded),
    }


# ----------------------------------------------------------------------------- journal
#: Each store's verification, kept between loads of the journal page: a load checks the entries
#: appended since the last one, and the whole journal again when its last whole pass is older than
#: ``VERIFY_FROM_START_S`` (a whole pass reads every entry: seconds for a journal of a few hundred
#: thousand).
_verifications: weakref.WeakKeyDictionary[Store, Resumable] = weakref.WeakKeyDictionary()
_verifications_lock = threading.Lock()
VERIFY_FROM_START_S = 600.0


def journal_overview(store: Store, per_stream: int = 5, streams: int = 20) -> dict[str, Any]:
    """The hash chain's verification and the latest entries of the busiest recent streams."""
    from fencepost.journal import head

    with _verifications_lock:
        kept = _verifications.get(store)
        if kept is None:
            kept = _verifications[store] = Resumable()
    last_whole = kept.checked_from_start_at
    report = kept.report(store, from_start=last_whole is not None
                         and time.monotonic() - last_whole >= VERIFY_FROM_START_S)
    whole_age_s = time.monotonic() - cast(float, kept.checked_from_start_at)
    h = head(store)
    recent: dict[str, list[Any]] = {}
    unplaced: list[Unreadable] = []
    if h is not None:
        # Read as ``journal show`` reads a stream: an entry the journal cannot decode is shown in
        # its place by seq and position, the others as usual (``store.journal.log`` would refuse
        # the whole page for it).
        for row in log_page(store, max(0, h.position - 500), 500):
            e = readable(row, "log")
            stream = row.run_id
            if type(e) is Unreadable and (type(stream) is not str or "\ufffd" in stream):
                unplaced.append(e)  # even its stream cannot be read
                continue
            recent.setdefault(stream, []).append(e)
    ordered = sorted(recent.items(), key=lambda kv: kv[1][-1].position, reverse=True)[:streams]
    latest = [{
        "stream": stream, "label": _stream_label(stream, entries),
        "entries": [_entry_view(e) for e in reversed(entries[-per_stream:])],
    } for stream, entries in ordered]
    return {"report": report, "head": h, "latest": latest, "checked_from_start_s": round(whole_age_s),
            "unplaced": [_entry_view(e) for e in unplaced]}


def _entry_view(e: Any) -> dict[str, Any]:
    if type(e) is Unreadable:
        return {"seq": "-" if e.seq is None else e.seq, "position": e.position, "when": when(e.emitted_at_ms),
                "type": "-", "source": "-", "payload": f"(cannot be decoded: {e.detail})", "undecodable": True}
    return {"seq": e.seq, "position": e.position, "when": when(e.emitted_at_ms), "type": e.event_type,
            "source": e.source_id, "payload": _short(redacted(e.payload)), "undecodable": False}


def _stream_label(stream: str, entries: list[Any]) -> str:
    from fencepost.journal import COMPANION_PREFIX

    if stream.startswith(COMPANION_PREFIX):
        for e in entries:
            rid = e.payload.get("runId") if type(e) is not Unreadable and isinstance(e.payload, dict) else None
            if isinstance(rid, str):
                return f"ownership facts of {rid}"
        return "companion stream"
    return f"run {stream}"


def _short(value: Any) -> str:
    text = _encoder.encode(value).decode()
    return text if len(text) <= 200 else text[:200] + "..."


# ----------------------------------------------------------------------------- projections
def projections(store: Store) -> list[dict[str, Any]]:
    """Each projection checkpointed on this database: position, lag, rejections, rebuild history.

    Uses ``ProjectionBuilder.status()`` / ``rebuilds()``, both read-only, on the store's own database.
    """
    with store_reads("projections"):
        return _projections(store)


def _projections(store: Store) -> list[dict[str, Any]]:
    from fencepost._migrations import applied
    from fencepost.projections import ProjectionBuilder
    from fencepost.projections._recorded import checkpointed

    if not applied(store.db):
        # The store was open and migrated: no ledger now means its tables went away (a dropped
        # schema, say), not "no projections". Fail as every other page does then.
        raise PersistenceError("persistence_failed", "projections", "the store's tables are not there")
    out = []
    for recorded in checkpointed(store.db):
        # The library's own status, against the tables the builder recorded for the projection.
        builder = ProjectionBuilder(store, store.db, recorded)
        status = builder.status()
        out.append({
            "name": status.name, "feed": status.feed, "source": status.source,
            "applied_revision": status.applied_revision, "current_source": status.current_source,
            "source_revision": status.source_revision, "lag": status.lag, "applied": status.applied,
            "rejected": status.rejected, "rebuilds": status.rebuilds, "pending_rebuild": status.pending_rebuild,
            "history": [{
                "reason": r.reason, "from": f"{(r.from_source or '-')[:8]}@{r.from_revision}",
                "to": f"{r.to_source[:8]}@{r.to_revision}", "applied": r.applied,
                "started": when(r.started_at_ms), "finished": when(r.finished_at_ms),
            } for r in builder.rebuilds()],
        })
    return out


# ----------------------------------------------------------------------------- health
def oldest_heartbeat(store: Store) -> tuple[str, int] | None:
    """The running run whose heartbeat is oldest, and that heartbeat (a stuck-worker signal)."""
    r = flows_runs.c
    stmt = (select(r.run_id, r.heartbeat_at_ms).where(r.status == "running", r.heartbeat_at_ms.is_not(None))
            .order_by(r.heartbeat_at_ms, r.run_id).limit(1))
    with store_reads("oldest heartbeat"):
        row = store.db.read(lambda conn: conn.execute(stmt).first())
    return None if row is None else (row[0], int(row[1]))


def health(store: Store, hub: FeedHub | None, name: str | None = None) -> dict[str, Any]:
    """Feed position and source, writes/s over the last minute, the oldest running heartbeat.

    ``name``: the store's name in a console over several stores (its own rates and follower position).
    """
    from fencepost._durable import redact_url
    from fencepost.journal import head

    position = store.feed.position()
    h = head(store)
    runs_rate, journal_rate, followed = None, None, None
    if hub is not None and name is not None:
        runs_rate, journal_rate = hub.rates_of(name)  # type: ignore[attr-defined]
        followed = hub.positions.get(name)  # type: ignore[attr-defined]
    elif hub is not None:
        (runs_rate, journal_rate), followed = hub.rates(), hub.position
    oldest = oldest_heartbeat(store)
    now = store.clock.now_ms()
    return {
        "database": redact_url(store.url), "backend": store.db.backend.name,
        "source": position.source, "revision": position.revision,
        "journal_head": h.position if h else 0,
        "run_writes_per_s": runs_rate.per_s if runs_rate else None,
        "journal_appends_per_s": journal_rate.per_s if journal_rate else None,
        "window_s": runs_rate.window_s if runs_rate else None,
        "oldest_heartbeat": None if oldest is None else {
            "run_id": oldest[0], "at": when(oldest[1]), "age_s": round((now - oldest[1]) / 1000, 1),
        },
        "follower": {"subscribers": hub.subscribers, "position": followed.revision if followed else None,
                     "error": hub.errors.get(name) if name is not None else hub.error,
                     } if hub is not None else None,
    }


def stats(store: Store, hub: FeedHub) -> dict[str, Any]:
    """The live ``stats`` event: status counts, projection lags and health, computed once for every page.

    ``as_of`` is the feed position read before the counts: they include every write up to it. A page
    connecting gets the hub's last sample at once, which can predate the page's own figures (the
    runs page's counts are read after the position it was rendered at); ``as_of`` says which is newer.
    """
    at = store.feed.position()
    out: dict[str, Any] = {"as_of": {"source": at.source, "revision": at.revision},
                           "counts": status_counts(store), "health": health(store, hub)}
    try:
        out["projections"] = [{k: p[k] for k in ("name", "applied_revision", "source_revision", "lag", "applied",
                                                 "rejected", "rebuilds")} for p in projections(store)]
    except FencepostError:
        out["projections"] = None
    return out


def stats_across(stores: Mapping[str, Store], hub: FeedHub) -> dict[str, Any]:
    """The live ``stats`` event of a console over several stores: counts summed over the stores
    that answer, and per store its health, lags, ``counts`` and their ``as_of`` (as ``stats`` has
    them over one store: the store's feed position read before its counts, so that a page compares
    each store's counts with what it has of that store); for a store that does not answer, its
    ``error`` code (``down_part``) instead. Raises when no store answers."""

    def part(name: str, store: Store) -> tuple[dict[str, Any], dict[str, int]]:
        at = store.feed.position()
        out: dict[str, Any] = {"as_of": {"source": at.source, "revision": at.revision},
                               "health": health(store, hub, name)}
        try:
            out["projections"] = [{k: p[k] for k in ("name", "applied_revision", "source_revision", "lag",
                                                     "applied", "rejected", "rebuilds")} for p in projections(store)]
        except FencepostError:
            out["projections"] = None
        out["counts"] = status_counts(store)
        return out, out["counts"]

    # A store the hub found down is not read again here (a refused connection is retried for
    # seconds, which would hold every store's statistics back): the hub's own sample, once a
    # tick, notices when it answers again.
    answers, down = each_store(stores, part, known_down=getattr(hub, "down", None))
    return {"counts": _summed(each for _, each in answers.values()),
            "stores": {name: answers[name][0] if name in answers else down[name] for name in stores}}
