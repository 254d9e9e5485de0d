"""The four lease durations (seed ``leases.md``), in one leaf module.

Both the run store (its staleness cutoff) and ownership supervision (its pulse and write
tolerance) read them from here, so no constant is restated anywhere else. The write tolerance is
derived, never chosen: a peer may steal the instant a heartbeat is ``STALE_AFTER`` old, its clock
may already read ``SKEW_ALLOWANCE`` ahead, and one more ``HEARTBEAT_INTERVAL`` is kept to reconfirm
before the owner interrupts its work.
"""

from __future__ import annotations

from datetime import timedelta

HEARTBEAT_INTERVAL = timedelta(seconds=1)
"""How often a supervision loop pulses."""

STALE_AFTER = timedelta(seconds=30)
"""How old a persisted heartbeat must be (strictly) before a peer may steal the run."""

SKEW_ALLOWANCE = timedelta(seconds=10)
"""How far a caller's ``now_ms`` may run ahead of the store's clock on a lease operation."""

WRITE_TOLERANCE = STALE_AFTER - SKEW_ALLOWANCE - HEARTBEAT_INTERVAL
"""How long an owner may keep working through failing heartbeat writes (19 s, derived)."""


def _ms(d: timedelta) -> int:
    return d // timedelta(milliseconds=1)


HEARTBEAT_INTERVAL_MS = _ms(HEARTBEAT_INTERVAL)
STALE_AFTER_MS = _ms(STALE_AFTER)
SKEW_ALLOWANCE_MS = _ms(SKEW_ALLOWANCE)
WRITE_TOLERANCE_MS = _ms(WRITE_TOLERANCE)


def is_stale(heartbeat_at_ms: int | None, now_ms: int) -> bool:
    """True when a lease stamped ``heartbeat_at_ms`` is stale at ``now_ms`` (no stamp is stale).

    Stale is strict: at exactly ``STALE_AFTER`` old the lease is still fresh.
    """
    return heartbeat_at_ms is None or heartbeat_at_ms < now_ms - STALE_AFTER_MS


__all__ = [
    "HEARTBEAT_INTERVAL",
    "SKEW_ALLOWANCE",
    "STALE_AFTER",
    "WRITE_TOLERANCE",
    "is_stale",
]
