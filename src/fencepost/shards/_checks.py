"""Argument checks of the shard set: every refusal names the argument, never its value.

``open_shards`` checks its own arguments, and the options it hands to every store's open, before it
looks at or creates any store, so a bad argument changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fencepost._values import identifier_problem
from fencepost.changefeed.feed import MAX_CHANGES_LIMIT
from fencepost.changefeed.types import Position
from fencepost.errors import RunStoreError
from fencepost.runstore import _checks as run_checks
from fencepost.runstore.attempts import validate_policy
from fencepost.shards.membership import ShardError

__all__ = ["limit", "open_options", "positions", "run_id", "run_id_not_reserved"]


def open_options(*, clock: Any, attempt_policy: Any, readonly: Any, grow: Any) -> None:
    """``open_shards``'s options: ``attempt_policy`` as a store's open checks it (``invalid_attempt``),
    the others ``invalid_shards``."""
    for field, value in (("readonly", readonly), ("grow", grow)):
        if type(value) is not bool:
            raise ShardError("invalid_shards", "open_shards", f"{field} must be True or False")
    if clock is not None and not callable(getattr(clock, "now_ms", None)):
        raise ShardError("invalid_shards", "open_shards", "clock must be a Clock (an object with now_ms())")
    validate_policy(attempt_policy)


def run_id(value: object, method: str) -> str:
    """A run id for a lookup of the set (``place``, ``locate``, ``store_for``): ``invalid_run``."""
    problem = identifier_problem(value)
    if problem:
        raise ShardError("invalid_run", method, f"run_id {problem}")
    return value  # type: ignore[return-value]


def run_id_not_reserved(value: object, method: str) -> str:
    """``run_id``, also refusing an id in the journal's reserved companion-stream namespace as the run
    store refuses it (``invalid_run``, the run store's words and cause): no run can have it."""
    rid = run_id(value, method)
    try:
        run_checks.not_companion(rid, method)
    except RunStoreError as exc:
        err = ShardError(exc.code, method, exc.detail)
        err.cause = getattr(exc, "cause", {})  # type: ignore[attr-defined]
        raise err from None
    return rid


def positions(value: object, names: tuple[str, ...], method: str) -> dict[str, Position | None]:
    """A merged feed's ``positions``: ``None``, or a mapping of this set's shard names to a ``Position``
    (or ``None``: that shard starts at revision 0). ``invalid_shards`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ShardError("invalid_shards", method, "positions must be a mapping of shard name to Position")
    out: dict[str, Position | None] = {}
    for i, (name, pos) in enumerate(value.items()):
        if type(name) is not str or name not in names:
            raise ShardError("invalid_shards", method, f"positions key #{i} is not a shard of this set")
        if pos is not None and type(pos) is not Position:
            raise ShardError("invalid_shards", method, f"positions entry #{i} must be a Position or None")
        out[name] = pos
    return out


def limit(value: object, method: str) -> int:
    """A merged feed's page size, as each store's ``changes_since`` takes it (1..1000): checked at the
    call with ``positions``, not when the first page is read. ``invalid_shards`` otherwise."""
    if type(value) is not int or not 1 <= value <= MAX_CHANGES_LIMIT:
        raise ShardError("invalid_shards", method, f"limit must be an integer in 1..{MAX_CHANGES_LIMIT}")
    return value
