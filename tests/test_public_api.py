"""The public surface: what SPEC §3 lists is importable from ``fencepost``, and documented."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

import fencepost

DOCS = Path(__file__).resolve().parents[1] / "docs"
SPEC_NAMES = [
    "open", "Store", "OwnerId", "RunSnapshot", "RunRow", "LivenessEvidence", "Attempt", "AttemptPolicy",
    "Position", "Change", "FencepostError", "RunStoreError", "AttemptStoreError", "JournalError",
    "SourceChanged",
    # every outcome class of the seeds' tables
    "Claimed", "Activated", "AlreadyClaimed", "HeartbeatFresh", "SnapshotChanged", "EvidenceRequired",
    "LivenessUnconfirmed", "ClaimLost", "ClaimFresh", "ClaimChanged", "FenceLost", "GuardFailed", "Updated",
    "Transitioned", "NotFound", "CancelRequested", "AlreadyRequested", "Terminal", "Abandoned", "Recovered",
    "Inserted", "Upserted", "ExistingSame", "Conflict", "RunNotFound", "Finished", "StateChanged", "Patched",
]


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_spec_name_is_exported(name: str) -> None:
    assert name in fencepost.__all__
    assert getattr(fencepost, name) is not None


def test_open_error_is_public_and_a_fencepost_error() -> None:
    """Every failure of ``fencepost.open`` is an ``OpenError`` (a ``FencepostError``) with a code."""
    assert "OpenError" in fencepost.__all__
    assert issubclass(fencepost.OpenError, fencepost.FencepostError)
    err = fencepost.OpenError("cannot_connect", "open", "cannot connect", db_code=None)
    assert err.code == "cannot_connect" and err.db_code is None


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert fencepost.__all__ == sorted(fencepost.__all__)
    for name in fencepost.__all__:
        assert hasattr(fencepost, name), name


def test_every_exported_name_is_documented() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md"))
    missing = [n for n in fencepost.__all__ if not re.search(rf"\b{re.escape(n)}\b", text)]
    assert missing == []


def test_outcomes_are_frozen_tagged_structs_usable_in_match() -> None:
    claimed = fencepost.Claimed(claimed_at_ms=5)
    assert isinstance(claimed, msgspec.Struct)
    with pytest.raises(AttributeError):
        claimed.claimed_at_ms = 6  # type: ignore[misc]
    match claimed:
        case fencepost.Claimed(claimed_at_ms=t):
            assert t == 5
        case _:
            pytest.fail("Claimed did not match its own class pattern")
    encoded = msgspec.json.decode(msgspec.json.encode(fencepost.Terminal(status="completed")))
    assert encoded["status"] == "completed" and "Terminal" in encoded.values()


@pytest.mark.parametrize("name", ["open_shards", "ShardSet", "ShardChange", "ShardError"])
def test_shard_names_are_exported_from_the_package_and_the_subpackage(name: str) -> None:
    import fencepost.shards

    assert name in fencepost.__all__
    assert getattr(fencepost, name) is getattr(fencepost.shards, name)


def test_the_run_store_exports_every_outcome_class_to_type_checkers_too() -> None:
    """``__all__`` is a literal list (what type checkers read: with ``sorted({...})`` they saw no
    ``fencepost.Claimed``); it must still name every outcome class, and ``fencepost`` re-export it."""
    import fencepost.runstore
    from fencepost.runstore.outcomes import ATTEMPT_OUTCOMES, RUN_OUTCOMES

    base = {"Attempt", "AttemptPolicy", "AttemptStore", "LivenessEvidence", "Outcome", "RunFailure", "RunRow",
            "RunSnapshot", "RunStore"}
    assert fencepost.runstore.__all__ == sorted(base | {c.__name__ for c in RUN_OUTCOMES + ATTEMPT_OUTCOMES})
    assert set(fencepost.runstore.__all__) <= set(fencepost.__all__)
    assert len(fencepost.__all__) == len(set(fencepost.__all__))
