"""Worker processes for test_membership_races.py (module-level so spawned children can import them)."""

from __future__ import annotations

from typing import Any

import fencepost
from fencepost.errors import FencepostError


def open_rounds(idx: int, rounds: list[Any], grow: bool, barrier: Any, out: Any) -> None:
    """Process ``idx``: for each round's URLs (a list, or a mapping of name to URL), wait for the other processes,
    then open the set at once with them; report each round's outcome: ``("ok", set_id, generation)``
    or ``("refused", code, detail)``."""
    outcomes: list[tuple[str, str, Any]] = []
    try:
        for urls in rounds:
            barrier.wait(timeout=60)
            try:
                with fencepost.open_shards(urls, grow=grow) as shards:
                    outcomes.append(("ok", shards.membership.set_id, shards.membership.generation))
            except FencepostError as exc:
                outcomes.append(("refused", exc.code, str(exc)))
        out.put(("done", idx, outcomes))
    except BaseException as exc:  # report to the parent instead of dying silently
        barrier.abort()
        out.put(("error", idx, f"{type(exc).__name__}: {str(exc)[:300]}"))
