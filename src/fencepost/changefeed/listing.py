"""Keyset listing of runs on ``(created_at_ms, run_id)`` with live-page semantics (REFERENCE 4).

Each page is one snapshot, coherent at its own revision. The next page starts strictly after the
last key handed out, so a run created later with a larger key can still appear, one with a smaller
key is never revisited, and a deletion or status change can drop a later match. ``created_at_ms``
and ``run_id`` are immutable (triggers), which keeps keys stable; changes behind an issued cursor
reach consumers through the change feed, not the listing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, bindparam, func, or_, select
from sqlalchemy.engine import Connection

from fencepost._durable import DbFailure, carry_failure
from fencepost.changefeed import _sql
from fencepost.changefeed.cursor import (
    MAX_LIST_LIMIT,
    ListFilters,
    decode_cursor,
    encode_cursor,
    invalid_options,
    parse_filters,
)
from fencepost.changefeed.feed import read_position
from fencepost.changefeed.snapshot import Corrupt, decode_run
from fencepost.changefeed.types import Observed, RunPage
from fencepost.errors import FencepostError, RunStoreError

if TYPE_CHECKING:
    from fencepost._store import Store

runs = _sql.runs


def _filtered(store: Store, stmt: Any, filters: ListFilters) -> Any:
    if isinstance(filters.status, tuple):
        stmt = stmt.where(store.db.backend.any_of(runs.status, "f_statuses"))
    elif filters.status is not None:
        stmt = stmt.where(runs.status == bindparam("f_status"))
    if filters.flow_name is not None:
        stmt = stmt.where(store.db.backend.json_string_is(runs.state_json, "flowName", bindparam("f_flow")))
    if filters.parent_run_id:
        if filters.parent_run_id[0] is None:
            stmt = stmt.where(runs.parent_run_id.is_(None))
        else:
            stmt = stmt.where(runs.parent_run_id == bindparam("f_parent"))
    if filters.lineage_id is not None:
        # ``coalesce(lineage_id, run_id) = L`` as its two cases, each of which an index answers (the
        # lineage's, the key): a run naming the lineage, or its first run, which names none. The
        # expression itself is in no index: it read every run.
        stmt = stmt.where(or_(runs.lineage_id == bindparam("f_lineage"),
                              and_(runs.lineage_id.is_(None), runs.run_id == bindparam("f_lineage"))))
    if filters.waiting_reason:
        if filters.waiting_reason[0] is None:
            stmt = stmt.where(runs.waiting_reason.is_(None))
        else:
            stmt = stmt.where(runs.waiting_reason == bindparam("f_reason"))
    if filters.created_after_ms is not None:
        stmt = stmt.where(runs.created_at_ms >= bindparam("f_after"))
    if filters.created_before_ms is not None:
        stmt = stmt.where(runs.created_at_ms <= bindparam("f_before"))
    return stmt


def _statement(store: Store, filters: ListFilters, keyset: bool, newest_first: bool = False) -> Any:
    stmt = _filtered(store, _sql.LIST_BASE, filters)
    if newest_first:
        if keyset:
            stmt = stmt.where(_sql.before_key())
        return stmt.order_by(runs.created_at_ms.desc(), runs.run_id.desc()).limit(bindparam("n"))
    if keyset:
        stmt = stmt.where(_sql.after_key())
    return stmt.order_by(runs.created_at_ms, runs.run_id).limit(bindparam("n"))


def _params(parsed: ListFilters) -> dict[str, Any]:
    return {
        "f_status": parsed.status if isinstance(parsed.status, str) else None,
        "f_statuses": list(parsed.status) if isinstance(parsed.status, tuple) else None,
        "f_flow": parsed.flow_name,
        "f_parent": parsed.parent_run_id[0] if parsed.parent_run_id else None,
        "f_lineage": parsed.lineage_id,
        "f_reason": parsed.waiting_reason[0] if parsed.waiting_reason else None,
        "f_after": parsed.created_after_ms,
        "f_before": parsed.created_before_ms,
    }


def list_runs(store: Store, filters: Mapping[str, Any] | None, cursor: str | None, limit: int, *,
              newest_first: bool = False) -> RunPage:
    """Return one page of runs matching ``filters``, after ``cursor``, at most ``limit`` (1..200).

    ``newest_first=True`` walks the same key backwards (newest ``(created_at_ms, run_id)`` first);
    its cursors carry the order, so a cursor of one order is ``invalid_cursor`` in the other.

    ``filters`` keys: ``status`` (one status, or a list: any of them), ``flow_name`` (the state's
    ``flowName``), ``parent_run_id`` and ``waiting_reason`` (``None`` means "has none"),
    ``lineage_id`` (a run without one is its own lineage), ``created_after_ms`` /
    ``created_before_ms`` (inclusive). Errors: ``invalid_options`` (unknown filter, bad value or
    limit, cursor over 65 536 characters), ``invalid_cursor`` (not a cursor, or issued for other
    filters or the other order), ``SourceChanged`` (issued on another source), ``list_failed`` (a
    database failure or a corrupt row, the cause named).
    """
    if type(limit) is not int or not 1 <= limit <= MAX_LIST_LIMIT:
        raise invalid_options(f"limit must be an integer in 1..{MAX_LIST_LIMIT}")
    parsed = parse_filters(filters)
    if cursor is not None and type(cursor) is not str:
        raise invalid_options("cursor must be a string returned by list_runs")
    if type(newest_first) is not bool:
        raise invalid_options("newest_first must be a boolean")
    params = _params(parsed)
    params["n"] = limit + 1
    stmt = _statement(store, parsed, cursor is not None, newest_first)

    def body(conn: Connection) -> RunPage:
        position = read_position(conn)
        source, watermark = position.source, position.revision
        if cursor is not None:
            params["after_created"], params["after_run"] = decode_cursor(
                cursor, source, parsed, newest_first=newest_first
            )
        rows = conn.execute(stmt, params).all()
        has_more = len(rows) > limit
        page = [decode_run(r, source, watermark) for r in rows[:limit]]
        next_cursor = None
        if has_more:
            last = page[-1]
            next_cursor = encode_cursor(source, parsed, last.created_at_ms, last.run_id, newest_first=newest_first)
        return RunPage(page, next_cursor, source, watermark)

    return _read(store, "list_runs", body)


def count_runs(store: Store, filters: Mapping[str, Any] | None) -> int:
    """How many runs match ``filters`` now (the same filters as ``list_runs``; one query)."""
    parsed = _as_method("count_runs", parse_filters, filters)
    stmt = _filtered(store, select(func.count()).select_from(_sql.flows_runs), parsed)
    return _read(store, "count_runs", lambda conn: int(conn.execute(stmt, _params(parsed)).scalar_one()))


def iter_runs(
    store: Store,
    filters: Mapping[str, Any] | None,
    *,
    cursor: str | None = None,
    page_size: int = MAX_LIST_LIMIT,
    newest_first: bool = False,
) -> Iterator[Observed]:
    """Every run matching ``filters``, page after page of ``list_runs`` (each page one snapshot).

    The arguments are checked when it is called (``invalid_options`` from ``iter_runs`` naming the
    argument, before any query); the pages are read as the iterator is consumed."""
    if type(page_size) is not int or not 1 <= page_size <= MAX_LIST_LIMIT:
        raise RunStoreError("invalid_options", "iter_runs", f"page_size must be an integer in 1..{MAX_LIST_LIMIT}")
    _as_method("iter_runs", parse_filters, filters)
    if cursor is not None and type(cursor) is not str:
        raise RunStoreError("invalid_options", "iter_runs", "cursor must be a string returned by list_runs")
    if type(newest_first) is not bool:
        raise RunStoreError("invalid_options", "iter_runs", "newest_first must be a boolean")
    return _iter_pages(store, filters, cursor, page_size, newest_first)


def _iter_pages(store: Store, filters: Mapping[str, Any] | None, cursor: str | None, page_size: int,
                newest_first: bool) -> Iterator[Observed]:
    while True:
        page = list_runs(store, filters, cursor, page_size, newest_first=newest_first)
        yield from page.runs
        if page.cursor is None:
            return
        cursor = page.cursor


def _as_method(method: str, check: Any, *args: Any) -> Any:
    """``check(*args)``, its ``invalid_options`` error naming ``method`` (the call the caller made)."""
    try:
        return check(*args)
    except RunStoreError as exc:
        if type(exc) is not RunStoreError or exc.code != "invalid_options":
            raise
        raise RunStoreError("invalid_options", method, exc.detail) from None


def _read(store: Store, method: str, body: Any) -> Any:
    try:
        return store.db.read(body)
    except FencepostError:
        raise
    except DbFailure as exc:
        err = carry_failure(RunStoreError("list_failed", method, f"listing failed ({exc.category})"
                                          + (f": {exc.reason}" if exc.reason else "")), exc)
        if exc.category == "decode_failed":  # a stored value that cannot be decoded: as a corrupt row
            err.cause = {"code": "decode_failed"}  # type: ignore[attr-defined]
        raise err from None
    except Corrupt as exc:
        # The same verdict and rule as ``runs.get`` and ``feed.read``; the listing's own code wraps it.
        err = RunStoreError("list_failed", method, f"decode_failed: {exc}")
        err.cause = {"code": "decode_failed"}  # type: ignore[attr-defined]
        raise err from None
