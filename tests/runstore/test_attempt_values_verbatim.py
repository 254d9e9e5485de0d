"""Defect (found by a review, docs only, SQLite and PostgreSQL): the journal page said run state and
attempt *outcomes* are never redacted, the durable-values page said all attempt values; the code
stores every attempt value (``checkpoint``, ``error``, ``outcome``, ``meta``) as given.

That is the behaviour kept, and both pages now say so: an attempt's ``error`` is a value the caller
composes and reads back, and ``put`` compares it for idempotency, so redacting it would turn a
replayed ``put`` of the same attempt into a ``Conflict`` (a run's failure, which the store formats
from an exception, is redacted).
"""

from __future__ import annotations

from fencepost.runstore.rows import Attempt
from tests.runstore.conftest import A, activate_new

SECRET = "password=hunter2ERR"


def test_attempt_values_round_trip_as_given_and_a_replayed_put_is_the_same(store, clock):
    activate_new(store, "r1", A)
    attempt = Attempt("r1", "d" * 64, 1, "running", clock.now_ms(), checkpoint={"password": SECRET},
                      error={"message": f"login failed {SECRET}"}, meta={"token": SECRET})
    assert type(store.attempts.put(attempt, A)).__name__ == "Inserted"
    stored = store.attempts.get("r1", "d" * 64, 1)
    assert stored.error == attempt.error and stored.checkpoint == attempt.checkpoint and stored.meta == attempt.meta
    assert type(store.attempts.put(attempt, A)).__name__ == "ExistingSame"
