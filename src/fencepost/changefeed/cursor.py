"""Listing filters and the opaque keyset cursor (REFERENCE 4, ``RunCatalogRead.listRuns``).

A cursor is versioned JSON text ``{"version": 1, "source", "filters", "createdAtMs", "runId"}``:
the last key handed out, bound to the source it was read from and to the canonical filter tuple
``[status, flowName, [parentRunId]|[], lineageId, [waitingReason]|[], after, before]`` (``status``
is one status, or the sorted list when several are asked for). It is
opaque to callers: pass it back unchanged with the same filters (the limit may change). There are
no numeric offsets, so a page never shifts when earlier rows are deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from fencepost._values import identifier_problem, is_safe_int, text_problem
from fencepost.changefeed.snapshot import SOURCE_SHAPE, STATUSES
from fencepost.errors import RunStoreError

CURSOR_VERSION = 1
ACROSS_VERSION = 1  # of a cursor across several stores (encode_across)
MAX_CURSOR_CHARS = 65_536
MAX_LIST_LIMIT = 200

# Keys whose value None means "has none" rather than "any": presence in the mapping is the filter.
_NULLABLE = ("parent_run_id", "waiting_reason")
FILTER_KEYS = frozenset(
    {"status", "flow_name", "parent_run_id", "lineage_id", "waiting_reason", "created_after_ms", "created_before_ms"}
)


class ListFilters(msgspec.Struct, frozen=True):
    """Validated filters. ``parent_run_id`` / ``waiting_reason``: ``[]`` any, ``[None]`` none, ``[x]`` x.

    ``status`` is one status, or a sorted tuple of two or more (any of them).
    """

    status: str | tuple[str, ...] | None = None
    flow_name: str | None = None
    parent_run_id: tuple[str | None, ...] = ()
    lineage_id: str | None = None
    waiting_reason: tuple[str | None, ...] = ()
    created_after_ms: int | None = None
    created_before_ms: int | None = None

    def canonical(self, newest_first: bool = False) -> list[Any]:
        """The filter tuple a cursor is bound to (key order of the caller's mapping is irrelevant).

        A newest-first listing appends ``"newest_first"``, so its cursors never resume the other order.
        """
        return [
            list(self.status) if isinstance(self.status, tuple) else self.status,
            self.flow_name,
            list(self.parent_run_id),
            self.lineage_id,
            list(self.waiting_reason),
            self.created_after_ms,
            self.created_before_ms,
        ] + (["newest_first"] if newest_first else [])


class _CursorV1(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    source: str
    filters: list[Any]
    createdAtMs: int  # wire names of the cursor format (camelCase, as upstream)
    runId: str


_cursor_decoder = msgspec.json.Decoder(_CursorV1)
_encoder = msgspec.json.Encoder()


def invalid_options(detail: str) -> RunStoreError:
    return RunStoreError("invalid_options", "list_runs", detail)


def invalid_cursor(detail: str) -> RunStoreError:
    return RunStoreError("invalid_cursor", "list_runs", detail)


def parse_filters(filters: Mapping[str, Any] | None) -> ListFilters:
    """Validate a caller's filter mapping; unknown keys or ill-typed values are ``invalid_options``."""
    if filters is None:
        return ListFilters()
    if not isinstance(filters, Mapping):
        raise invalid_options("filters must be a mapping")
    unknown = sorted(k for k in filters if k not in FILTER_KEYS) if all(type(k) is str for k in filters) else None
    if unknown is None:
        raise invalid_options("filter names must be strings")
    if unknown:
        # The name is caller input: say how many are unknown, never which (errors carry no values).
        raise invalid_options(f"{len(unknown)} unknown filter name(s); known: {', '.join(sorted(FILTER_KEYS))}")
    values: dict[str, Any] = {}
    for key, value in filters.items():
        if key in ("created_after_ms", "created_before_ms"):
            if value is not None and not is_safe_int(value):
                raise invalid_options(f"{key} must be a non-negative safe integer")
            values[key] = value
            continue
        if key in _NULLABLE:
            if value is not None:
                _check_text(key, value)
            values[key] = (value,)
            continue
        if key == "status" and isinstance(value, list | tuple | set | frozenset):
            value = _statuses(value)
        elif value is not None:
            _check_text(key, value)
            if key == "status" and value not in STATUSES:
                raise invalid_options("status must be a run status")
        values[key] = value
    return ListFilters(**values)


def _statuses(value: list | tuple | set | frozenset) -> str | tuple[str, ...]:
    """Several statuses: each a run status, at least one; one alone is the plain status."""
    if not value or any(type(v) is not str or v not in STATUSES for v in value):
        raise invalid_options("status must be a run status or a non-empty list of run statuses")
    unique = tuple(sorted(set(value)))
    return unique[0] if len(unique) == 1 else unique


def _check_text(key: str, value: object) -> None:
    # Run ids are bounded identifiers; a flow name or waiting reason is any non-empty clean text.
    if key in ("parent_run_id", "lineage_id"):
        problem = identifier_problem(value)
    elif type(value) is not str:
        problem = "must be a string"
    else:
        problem = "must not be empty" if not value else text_problem(value)
    if problem:
        raise invalid_options(f"{key} {problem}")


def encode_cursor(source: str, filters: ListFilters, created_at_ms: int, run_id: str, *,
                  newest_first: bool = False) -> str:
    """The cursor that resumes after the key ``(created_at_ms, run_id)`` (in the listing's order)."""
    body = _CursorV1(CURSOR_VERSION, source, filters.canonical(newest_first), created_at_ms, run_id)
    return _encoder.encode(body).decode("utf-8")


def decode_cursor(cursor: object, source: str, filters: ListFilters, *, newest_first: bool = False) -> tuple[int, str]:
    """Return the key a cursor resumes after, or raise.

    Not a string: ``invalid_options``. Longer than 65 536 characters, not a version-1 cursor, or
    issued for other filters or the other order: ``invalid_cursor``. Issued on another source: ``SourceChanged``.
    Surrounding whitespace is tolerated.
    """
    from fencepost.errors import SourceChanged

    if type(cursor) is not str:
        raise invalid_options("cursor must be a string returned by list_runs")
    if len(cursor) > MAX_CURSOR_CHARS:
        raise invalid_cursor(f"cursor must be at most {MAX_CURSOR_CHARS} characters (got {len(cursor)})")
    try:
        body = _cursor_decoder.decode(cursor)
    except (msgspec.DecodeError, UnicodeEncodeError):
        raise invalid_cursor("cursor is not a listing cursor") from None
    if body.version != CURSOR_VERSION:
        raise invalid_cursor(f"cursor version must be {CURSOR_VERSION}")
    if not SOURCE_SHAPE.fullmatch(body.source) or not is_safe_int(body.createdAtMs) or identifier_problem(body.runId):
        raise invalid_cursor("cursor is malformed")
    if body.filters != filters.canonical(newest_first):
        raise invalid_cursor("cursor was issued for other filters or the other order")
    if body.source != source:
        raise SourceChanged("invalid_run", "list_runs", "listing cursor belongs to another source: restart the listing")
    return body.createdAtMs, body.runId


def encode_across(resume: Mapping[str, str | None]) -> str:
    """Encode the cursor of a listing merged from several named stores.

    ``resume`` maps each store's name to its own keyset cursor, ``None`` once that store's listing
    is done; a store not named has not been listed yet. The text is versioned JSON
    ``{"version": 1, "stores": {...}}``, opaque to callers like a single store's cursor.
    """
    return msgspec.json.encode({"version": ACROSS_VERSION, "stores": dict(resume)}).decode()


def decode_across(cursor: str | None, names: list[str]) -> dict[str, str | None]:
    """Decode a cursor ``encode_across`` made for a listing across the stores ``names``.

    ``None`` (the first page) decodes to ``{}``. Anything else that is not such a cursor (another
    version, a store not in ``names``, a store's cursor that is not text or null) raises
    ``RunStoreError('invalid_cursor')``; each store's own cursor is checked when it is used.
    """
    if cursor is None:
        return {}
    bad = RunStoreError("invalid_cursor", "list_runs",
                        "cursor is not a cursor of a listing across these stores (give the same --db)")
    try:
        body = msgspec.json.decode(cursor, type=dict[str, Any])
        stores = body.get("stores")
    except msgspec.DecodeError:
        raise bad from None
    if body.get("version") != ACROSS_VERSION or not isinstance(stores, dict) or not set(stores) <= set(names):
        raise bad
    if not all(v is None or isinstance(v, str) for v in stores.values()):
        raise bad
    return stores
