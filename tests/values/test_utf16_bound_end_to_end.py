"""The 1 024-unit identifier bound counts UTF-16 units end to end, on SQLite and PostgreSQL.

Pitfall "UTF-16 length": ``"\\U0001F600"`` is one Python character but two UTF-16 units, and both
databases' ``length()`` count characters, so only the library's check stands between 513 emoji
(1 026 units) and the database. Each write path that takes an identifier accepts 512 emoji exactly
(1 024 units, read back unchanged) and refuses 513 with its own ``invalid_*`` code, writing nothing.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost import Attempt, OwnerId, RunSnapshot

FITS, OVER = "\U0001F600" * 512, "\U0001F600" * 513
OWN = OwnerId("host-a", 42, "nonce-a")


def _count(store: fencepost.Store, table: str) -> int:
    return store.db.read(lambda c: int(c.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()))


def test_run_ids_count_astral_characters_twice(store: fencepost.Store) -> None:
    store.runs.create(FITS, "{}")
    assert store.runs.get(FITS).run_id == FITS
    before = _count(store, "flows_runs")
    with pytest.raises(fencepost.RunStoreError) as err:
        store.runs.create(OVER, "{}")
    assert err.value.code == "invalid_run"
    assert OVER not in str(err.value)
    assert _count(store, "flows_runs") == before


def test_journal_identifiers_count_astral_characters_twice(store: fencepost.Store) -> None:
    receipt = store.journal.append_unfenced(FITS, FITS, {}, source_id=FITS)
    assert receipt.seq == 0
    (entry,) = store.journal.entries(FITS).entries
    assert (entry.run_id, entry.event_type, entry.source_id) == (FITS, FITS, FITS)
    for run_id, event_type, source_id in ((OVER, "t", "p"), ("r", OVER, "p"), ("r", "t", OVER)):
        with pytest.raises(fencepost.JournalError) as err:
            store.journal.append_unfenced(run_id, event_type, {}, source_id=source_id)
        assert err.value.code == "invalid_event"
    assert _count(store, "flows_journal_events") == 1


def test_attempt_digests_count_astral_characters_twice(store: fencepost.Store) -> None:
    store.runs.create("r", "{}")
    store.runs.claim_and_own("r", RunSnapshot("pending", None, None), OWN, 0)
    fits = Attempt(run_id="r", step_key_digest=FITS, attempt=0, state="running", started_at_ms=1)
    store.attempts.put(fits, OWN)
    assert store.attempts.get("r", FITS, 0) == fits
    with pytest.raises(fencepost.AttemptStoreError) as err:
        store.attempts.put(Attempt(run_id="r", step_key_digest=OVER, attempt=0, state="running",
                                   started_at_ms=1), OWN)
    assert err.value.code == "invalid_attempt"
    assert _count(store, "flows_attempts") == 1
