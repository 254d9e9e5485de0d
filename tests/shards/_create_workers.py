"""Worker processes for test_create_races.py (module-level so spawned children can import them)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import fencepost
from fencepost._durable import Database
from fencepost.errors import FencepostError


def _pause_in_lone_writes(pause: float) -> None:
    """Every write made with ``alone=True`` (a write that another store's write may run inside) waits
    ``pause`` seconds once its lock is taken: two processes taking two stores' locks in opposite
    orders then cross for certain, where they would only seldom without it."""
    write = Database.write

    def paused(self: Database, fn: Callable[[Any], Any], *, durable: bool = True, alone: bool = False) -> Any:
        if not alone:
            return write(self, fn, durable=durable)

        def body(conn: Any) -> Any:
            time.sleep(pause)
            return fn(conn)

        return write(self, body, durable=durable, alone=True)

    Database.write = paused  # type: ignore[method-assign]


def create_rounds(urls: list[str], idx: int, plan: list[tuple[str, dict[str, Any]]], pause: float, barrier: Any,
                  out: Any) -> None:
    """Process ``idx``: open the set, then for each round of ``plan`` (a run id and the keyword
    arguments of its ``create``) wait for the other processes and create the run at once with them.
    ``pause``: seconds every lone write waits with its lock taken (see ``_pause_in_lone_writes``).

    Reports ``("done", idx, outcomes)``, an outcome per round: ``("ok", "", seconds)`` or
    ``("refused", "<error class>:<code>", seconds)``, ``seconds`` being how long the create took."""
    outcomes: list[tuple[str, str, float]] = []
    try:
        if pause:
            _pause_in_lone_writes(pause)
        with fencepost.open_shards(urls) as shards:
            barrier.wait(timeout=60)
            for run_id, kwargs in plan:
                barrier.wait(timeout=60)
                began = time.monotonic()
                try:
                    shards.runs.create(run_id, "{}", **kwargs)
                    outcomes.append(("ok", "", time.monotonic() - began))
                except FencepostError as exc:
                    outcomes.append(("refused", f"{type(exc).__name__}:{exc.code}", time.monotonic() - began))
        out.put(("done", idx, outcomes))
    except BaseException as exc:  # report to the parent instead of dying silently
        barrier.abort()
        out.put(("error", idx, f"{type(exc).__name__}: {str(exc)[:300]}"))
