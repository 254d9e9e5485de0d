"""A consensus strategy passed to ``fencepost.open(consensus=...)`` that answers with the wrong type,
or raises, as the run store and the journal see it.

Defects: a ``guard`` answering a truthy non-bool (``Lost()``, the string ``"False"``) admitted every
caller, so a non-holder's fenced append was stored (``transition_owned`` was still refused by the
row's own owner check); a wrong answer from ``claim``/``activate``/``heartbeat`` was read as a refusal
(``SnapshotChanged``, ``FenceLost``) so a worker would retry or give up for a reason that never
happened; a ``guard`` that raised reached the journal's caller as the strategy's own exception,
its message (which may quote a secret) included.
"""

from __future__ import annotations

import pytest

import fencepost
from fencepost import JournalError, RunStoreError
from fencepost.journal.consensus import Lost, SqlConsensus
from fencepost.journal.owner import OwnerId

from .conftest import PENDING, A, facts

B = OwnerId("host-b", 202, "owner-b")
SECRET = "sk-live-STRATEGYSECRET1"


class _Answers(SqlConsensus):
    """The built-in strategy with one method answering ``value`` (or raising it)."""

    def __init__(self, method: str, value: object) -> None:
        self.method, self.value = method, value
        self.armed = False

    def _answer(self, name: str, real):
        if self.armed and name == self.method:
            if isinstance(self.value, BaseException):
                raise self.value
            return self.value
        return real()

    def guard(self, conn, run_id, owner):
        return self._answer("guard", lambda: super(_Answers, self).guard(conn, run_id, owner))

    def claim(self, conn, run_id, claimant, now_ms):
        return self._answer("claim", lambda: super(_Answers, self).claim(conn, run_id, claimant, now_ms))

    def activate(self, conn, run_id, owner, granted_at_ms, now_ms):
        return self._answer("activate",
                            lambda: super(_Answers, self).activate(conn, run_id, owner, granted_at_ms, now_ms))

    def heartbeat(self, conn, run_id, owner, now_ms):
        return self._answer("heartbeat", lambda: super(_Answers, self).heartbeat(conn, run_id, owner, now_ms))


@pytest.mark.parametrize("value", [Lost(), "False", 1, None], ids=["Lost", "str", "int", "None"])
def test_guard_answering_a_non_bool_admits_nobody(db_url, clock, value) -> None:
    """The journal's fence and transition_owned refuse with an error naming the method and the
    type; nothing is appended, the run keeps its owner."""
    strategy = _Answers("guard", value)
    with fencepost.open(db_url, clock=clock, consensus=strategy) as store:
        store.runs.create("r", "{}")
        store.runs.claim_and_own("r", PENDING, A, 0)
        strategy.armed = True
        for who in (A, B):
            with pytest.raises(JournalError) as err:
                store.journal.append("r", "log", {"n": 1}, owner=who, source_id="w")
            assert err.value.code == "persistence_failed"
            assert "guard returned" in str(err.value) and type(value).__name__ in str(err.value)
        with pytest.raises(RunStoreError) as run_err:
            store.runs.transition_owned("r", B, "completed")
        assert run_err.value.code == "persistence_failed" and "guard returned" in str(run_err.value)
        assert store.journal.entries("r").entries == []
        row = store.runs.get("r")
        assert (row.status, row.owner) == ("running", A)


@pytest.mark.parametrize(("method", "value"), [("claim", True), ("claim", None), ("activate", True),
                                               ("heartbeat", 5)],
                         ids=["claim-bool", "claim-None", "activate-bool", "heartbeat-int"])
def test_wrong_answer_is_an_error_not_an_outcome(db_url, clock, method, value) -> None:
    """A wrong answer is persistence_failed naming the method and the type, never a made-up
    SnapshotChanged or FenceLost; the transaction is rolled back (no lease, no fact, row as before)."""
    strategy = _Answers(method, value)
    with fencepost.open(db_url, clock=clock, consensus=strategy) as store:
        store.runs.create("r", "{}")
        if method == "heartbeat":
            store.runs.claim_and_own("r", PENDING, A, 0)
        before = (store.runs.get("r"), facts(store, "r"))
        strategy.armed = True
        with pytest.raises(RunStoreError) as err:
            if method == "heartbeat":
                store.runs.heartbeat("r", A, 10)
            else:
                store.runs.claim_and_own("r", PENDING, A, 0)
        assert err.value.code == "persistence_failed"
        assert f"{method} returned {type(value).__name__}" in str(err.value)
        assert (store.runs.get("r"), facts(store, "r")) == before
        strategy.armed = False
        assert store.db.write(lambda c: store.consensus.guard(c, "r", A)) is (method == "heartbeat")


def test_guard_that_raises_is_a_journal_error_without_its_text(db_url, clock) -> None:
    """The strategy's exception (quoting a secret) does not reach the caller: JournalError
    persistence_failed naming the exception type, no cause or context; nothing appended."""
    strategy = _Answers("guard", RuntimeError(f"cannot decide for {SECRET}"))
    with fencepost.open(db_url, clock=clock, consensus=strategy) as store:
        store.runs.create("r", "{}")
        store.runs.claim_and_own("r", PENDING, A, 0)
        strategy.armed = True
        with pytest.raises(JournalError) as err:
            store.journal.append("r", "log", {"n": 1}, owner=A, source_id="w")
        assert err.value.code == "persistence_failed" and "RuntimeError" in str(err.value)
        assert SECRET not in str(err.value) and err.value.__cause__ is None and err.value.__context__ is None
        strategy.armed = False
        assert store.journal.entries("r").entries == []
        assert store.journal.append("r", "log", {"n": 1}, owner=A, source_id="w").seq == 0
