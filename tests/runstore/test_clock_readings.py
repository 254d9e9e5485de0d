"""A store clock whose reading is no non-negative safe integer is refused by name in the run store.

Defect: a clock of one's own that reads fractional milliseconds (``time.time() * 1000``, an easy
slip) or a negative time made ``runs.create`` fail with ``constraint: RunStore.create: run
persistence failed`` (the column's CHECK refused the stamp), and a settle the same way, naming
neither the clock nor the rule, while the journal said ``clock reading must be a non-negative safe
integer``. The run store now says the same, ``invalid_run``, and writes nothing. Both backends.
"""

from __future__ import annotations

from typing import Any

import pytest

import fencepost
from fencepost import OwnerId, RunStoreError

from .conftest import count

ME = OwnerId("host-a", 1, "n-1")


class SwitchClock:
    """Reads ``good`` until ``reading`` is set to something else."""

    def __init__(self) -> None:
        self.reading: Any = 1_000

    def now_ms(self) -> Any:
        return self.reading

    def sleep(self, seconds: float) -> None:  # pragma: no cover - never waits here
        pass


BAD = [1_000.5, -5, 2**53, "1000", None]


@pytest.fixture
def clocked(db_url):
    clock = SwitchClock()
    with fencepost.open(db_url, clock=clock) as store:
        yield store, clock


@pytest.mark.parametrize("reading", BAD, ids=repr)
def test_create_with_a_bad_clock_reading_is_invalid_run_naming_the_clock(clocked, reading):
    store, clock = clocked
    clock.reading = reading
    for call in (lambda: store.runs.create("r", "{}"), lambda: store.runs.create_many([("r", "{}")])):
        with pytest.raises(RunStoreError) as err:
            call()
        assert err.value.code == "invalid_run", err.value
        assert "clock reading must be a non-negative safe integer" in str(err.value)
    assert count(store, "flows_runs") == 0


@pytest.mark.parametrize("reading", BAD, ids=repr)
def test_settling_with_a_bad_clock_reading_is_invalid_run_and_changes_nothing(clocked, reading):
    store, clock = clocked
    store.runs.create("r", "{}")
    store.runs.claim_and_own("r", store.runs.get("r"), ME, 1_000)
    clock.reading = reading
    with pytest.raises(RunStoreError) as err:
        store.runs.transition_owned("r", ME, "completed", state_json='{"done": 1}')
    assert err.value.code == "invalid_run", err.value
    assert "clock reading must be a non-negative safe integer" in str(err.value)
    clock.reading = 2_000
    row = store.runs.get("r")
    assert (row.status, row.state_json, row.owner) == ("running", "{}", ME)
