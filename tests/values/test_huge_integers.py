"""Integers too long to encode are refused by the value rules, naming the rule.

Defect (found by an input hunt, both backends): an integer of more than 4300 decimal digits (what
Python converts to text by default) in a journal payload or meta, or in an attempt's checkpoint,
error, outcome or meta, passed the durable value rules and then failed the encoding with Python's
own ``ValueError`` ("Exceeds the limit (4300 digits) for integer string conversion ..."). Nothing
was written, but the error was no fencepost error and named no field. Such an integer is now refused
like any other value the store cannot hold (``invalid_event`` / ``invalid_attempt``), and the
largest integer that fits is stored and read back exactly.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost import Attempt, OwnerId, RunSnapshot
from fencepost._values import MAX_INT_DIGITS

OWN = OwnerId("host-a", 1, "nonce-a")
LONGEST = 10**MAX_INT_DIGITS - 1  # 4300 nines
TOO_LONG = 10**MAX_INT_DIGITS


def _count(store: fencepost.Store, table: str) -> int:
    return store.db.read(lambda conn: conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar())


@pytest.mark.parametrize("where", ["payload", "meta"])
@pytest.mark.parametrize("how", ["append_unfenced", "append_many_unfenced"])
def test_a_journal_entry_with_an_integer_too_long_is_refused_naming_the_rule(store, where, how):
    def append(value: int) -> None:
        payload, meta = ({"n": value}, None) if where == "payload" else ({}, {"n": value})
        if how == "append_unfenced":
            store.journal.append_unfenced("r", "t", payload, source_id="p", meta=meta)
        else:
            store.journal.append_many_unfenced("r", [fencepost.journal.NewEntry("t", {}),
                                                     fencepost.journal.NewEntry("t", payload, meta=meta)],
                                               source_id="p")

    with pytest.raises(fencepost.JournalError) as err:
        append(TOO_LONG)
    assert err.value.code == "invalid_event" and f"more than {MAX_INT_DIGITS} digits" in str(err.value)
    assert "1000000" not in str(err.value)
    assert _count(store, "flows_journal_events") == 0
    append(LONGEST)
    entries = store.journal.entries("r").entries
    assert (entries[-1].payload if where == "payload" else entries[-1].meta) == {"n": LONGEST}


@pytest.mark.parametrize("field", ["checkpoint", "error", "outcome", "meta"])
def test_an_attempt_with_an_integer_too_long_is_refused_naming_the_field(store, field):
    store.runs.create("r", "{}")
    store.runs.claim_and_own("r", RunSnapshot("pending", None, None), OWN, 0)
    base = {"run_id": "r", "step_key_digest": "d", "attempt": 0, "state": "running", "started_at_ms": 1, "meta": {}}
    with pytest.raises(fencepost.AttemptStoreError) as err:
        store.attempts.put(Attempt(**(base | {field: {"n": TOO_LONG}})), OWN)
    assert err.value.code == "invalid_attempt"
    assert f"{field} contains an integer of more than {MAX_INT_DIGITS} digits" in str(err.value)
    assert _count(store, "flows_attempts") == 0
    store.attempts.put(Attempt(**base), OWN)
    if field in ("checkpoint", "meta"):
        with pytest.raises(fencepost.AttemptStoreError) as err:
            store.attempts.patch("r", "d", 0, OWN, **{field: {"n": TOO_LONG}})
        assert f"more than {MAX_INT_DIGITS} digits" in str(err.value)
    assert store.attempts.get("r", "d", 0) == Attempt(**base)
    store.attempts.put(Attempt(**(base | {"attempt": 1, field: {"n": LONGEST}})), OWN)
    assert getattr(store.attempts.get("r", "d", 1), field) == {"n": LONGEST}


def test_put_and_finish_name_the_checkpoint_size_limit(store):
    """Defect (same hunt): ``patch`` and ``heartbeat`` said ``checkpoint is N bytes, over
    max_checkpoint_bytes M``; ``put`` and ``finish`` said only that the attempt violates the
    contract, naming neither the field nor the limit."""
    store.runs.create("r", "{}")
    store.runs.claim_and_own("r", RunSnapshot("pending", None, None), OWN, 0)
    limit = store.attempts.policy.max_checkpoint_bytes
    big = "x" * limit
    base = {"run_id": "r", "step_key_digest": "d", "attempt": 0, "state": "running", "started_at_ms": 1, "meta": {}}
    for call in (lambda: store.attempts.put(Attempt(**(base | {"checkpoint": big})), OWN),
                 lambda: store.attempts.finish(Attempt(**(base | {"checkpoint": big, "state": "completed",
                                                                  "finished_at_ms": 2})), OWN)):
        with pytest.raises(fencepost.AttemptStoreError) as err:
            call()
        assert f"over max_checkpoint_bytes {limit}" in str(err.value) and "checkpoint is" in str(err.value)
        assert "xxxx" not in str(err.value)
    assert _count(store, "flows_attempts") == 0
