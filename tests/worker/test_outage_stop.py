"""What a worker leaves behind when the database is unavailable: stopping it during an outage, a
claim whose activation met the outage, and the retry loops' own deadlines under a test clock.

Outages are real where the timing matters (another connection holding the write lock past the
wait, as in ``test_outage_in_run``); a fault is injected with a wrapper only where a test must
choose the exact call that fails. Each test's docstring says what was wrong.
"""

from __future__ import annotations

import pytest

import fencepost.worker as worker_mod
from fencepost.errors import RunStoreError


@pytest.mark.parametrize("db_code, sweep, run_write", [
    ("SQLITE_BUSY", True, True), ("SQLITE_FULL", True, False), ("closed", False, False),
    ("read_only", False, False), ("file_replaced", False, False),
])
def test_one_rule_says_what_the_sweep_and_a_run_wait_out(db_code, sweep, run_write):
    """Regression guard for the one predicate: the sweep also waits out a full disk, a run's own
    writes retry only what the database marked transient, and neither waits for a store that never
    comes back."""
    err = RunStoreError("persistence_failed", "transition_owned", "run persistence failed")
    err.db_code = db_code  # type: ignore[attr-defined]
    err.transient = db_code == "SQLITE_BUSY"  # type: ignore[attr-defined]
    assert worker_mod._worth_waiting(err, sweep=True) is sweep
    assert worker_mod._worth_waiting(err) is run_write
    refused = RunStoreError("invalid_run", "transition_owned", "state_json is too large")
    assert not worker_mod._worth_waiting(refused, sweep=True) and not worker_mod._worth_waiting(refused)
