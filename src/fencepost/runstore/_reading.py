"""Read-side helpers over an opened store, shared by the CLI and the web console.

``run_exists`` says whether a store holds a run row; ``reconfirm_warnings`` reads back the
``lease-reconfirmed`` run decisions that ownership supervision journals on a run's own stream
(``fencepost.runstore.ownership``). Both only read.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fencepost.errors import RunStoreError
from fencepost.runstore.ownership import RUN_DECISION

__all__ = ["RunWarning", "reconfirm_warnings", "run_exists"]


class RunWarning(msgspec.Struct, frozen=True):
    """A journaled warning about a run: ``lease-reconfirmed`` after ``unconfirmed_ms`` without a pulse."""

    code: str
    unconfirmed_ms: int
    occurred_at_ms: int
    seq: int


def run_exists(store: Any, run_id: str) -> bool:
    """Whether ``store`` holds a run row with this id (an id the store refuses holds none)."""
    try:
        store.runs.get(run_id)
    except RunStoreError as exc:
        if exc.code in ("not_found_row", "invalid_run"):
            return False
        raise
    return True


def reconfirm_warning(e: Any) -> RunWarning | None:
    """The warning a journal entry of the run's own stream gives: one for a ``lease-reconfirmed``
    run decision, else None."""
    if e.event_type != RUN_DECISION:
        return None
    payload = e.payload if isinstance(e.payload, dict) else {}
    detail = payload.get("detail")
    ms = detail.get("unconfirmedMs") if isinstance(detail, dict) else None
    if payload.get("decision") == "lease-reconfirmed" and type(ms) is int and ms >= 0:
        return RunWarning("lease-reconfirmed", ms, e.emitted_at_ms, e.seq)
    return None


def reconfirm_warnings(store: Any, run_id: str) -> list[RunWarning]:
    """One warning per ``lease-reconfirmed`` run decision journaled on the run's own stream."""
    warnings: list[RunWarning] = []
    after = None
    while True:
        page = store.journal.entries(run_id, after=after, event_types=[RUN_DECISION], limit=1000)
        warnings += [w for w in map(reconfirm_warning, page.entries) if w is not None]
        if not page.has_more or not page.entries:
            return warnings
        after = page.entries[-1].seq
