"""Append-only journal streams, SqlConsensus leases, redaction, hash chain, replay and verify."""

from __future__ import annotations

import hashlib

from fencepost.journal.entries import Accepted, Duplicate, EntriesPage, Entry, NewEntry
from fencepost.journal.journal import Journal, JournalTransaction
from fencepost.journal.owner import OwnerId
from fencepost.journal.redaction import Redaction, Rule
from fencepost.journal.replay import (
    OwnershipHistory,
    OwnershipInterval,
    ReplaySummary,
    ReplayTotals,
    Violation,
    ownership_history,
    replay_all,
    replay_each,
)
from fencepost.journal.verify import Break, Head, VerifyReport, head, verify

COMPANION_PREFIX = "flows.companion/"


def companion_stream(run_id: str, stream: str = "run-store") -> str:
    """The companion stream id of ``run_id``: ``flows.companion/<stream>/<sha256 hex of run_id>``."""
    return f"{COMPANION_PREFIX}{stream}/{hashlib.sha256(run_id.encode('utf-8')).hexdigest()}"


def is_companion_run_id(run_id: str) -> bool:
    """True when ``run_id`` names a companion stream (a prefix test; run ids may not start with it)."""
    return run_id.startswith(COMPANION_PREFIX)


__all__ = [
    "COMPANION_PREFIX",
    "Accepted",
    "Break",
    "Duplicate",
    "EntriesPage",
    "Entry",
    "Head",
    "Journal",
    "JournalTransaction",
    "NewEntry",
    "OwnerId",
    "OwnershipHistory",
    "OwnershipInterval",
    "Redaction",
    "ReplaySummary",
    "ReplayTotals",
    "Rule",
    "VerifyReport",
    "Violation",
    "companion_stream",
    "head",
    "is_companion_run_id",
    "ownership_history",
    "replay_all",
    "replay_each",
    "verify",
]
