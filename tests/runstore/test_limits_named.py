"""Issue 11 (5): a refused value names the limit it broke (depth or nodes), never "not valid JSON"."""

from __future__ import annotations

import pytest

from fencepost import Attempt, AttemptStoreError, RunStoreError
from fencepost.journal.owner import OwnerId

from .conftest import PENDING, fresh

OWN = OwnerId("host-a", 42, "nonce-a")


def _deep(n: int) -> object:
    value: object = 0
    for _ in range(n):
        value = [value]
    return value


@pytest.fixture
def owned(mstore):
    rid = fresh("limits")
    mstore.runs.create(rid, "{}")
    mstore.runs.claim_and_own(rid, PENDING, OWN, mstore.clock.now_ms())
    return mstore, rid


def _attempt(rid: str, **kw: object) -> Attempt:
    base: dict = dict(run_id=rid, step_key_digest="digest-1", attempt=0, state="running", started_at_ms=10, meta={})
    base.update(kw)
    return Attempt(**base)


@pytest.mark.parametrize(("field", "value", "limit"), [
    ("meta", {"deep": _deep(200)}, "exceeds the depth limit of 128"),
    ("checkpoint", _deep(129), "exceeds the depth limit of 128"),
    ("outcome", list(range(100_001)), "exceeds the node limit of 100000"),
])
def test_put_and_finish_over_a_limit_name_it(owned, field: str, value: object, limit: str) -> None:
    s, rid = owned
    with pytest.raises(AttemptStoreError) as err:
        s.attempts.put(_attempt(rid, **{field: value}), OWN)
    assert str(err.value) == f"invalid_attempt: AttemptStore.put: attempt violates the persistence contract: " \
                             f"{field} {limit}"
    s.attempts.put(_attempt(rid), OWN)
    finished = _attempt(rid, state="completed", finished_at_ms=20, **{field: value})
    with pytest.raises(AttemptStoreError) as err:
        s.attempts.finish(finished, OWN)
    assert str(err.value) == f"invalid_attempt: AttemptStore.finish: finished attempt violates the contract: " \
                             f"{field} {limit}"
    # Nothing was written by the refusals.
    assert s.attempts.get(rid, "digest-1", 0) == _attempt(rid)


@pytest.mark.parametrize("depth", [129, 500, 1_000, 5_000])
def test_run_state_nested_too_deep_names_the_depth_limit(owned, depth: int) -> None:
    s, rid = owned
    text = "[" * depth + "]" * depth
    for call in (lambda: s.runs.create(fresh("deep"), text),
                 lambda: s.runs.transition_owned(rid, OWN, "running", text)):
        with pytest.raises(RunStoreError) as err:
            call()
        assert err.value.code == "invalid_run"
        assert "state_json exceeds the depth limit of 128" in str(err.value), str(err.value)
    assert s.runs.get(rid).state_json == "{}"


def test_malformed_run_state_is_still_not_valid_json(owned) -> None:
    s, _ = owned
    for text in ("[" * 300, '{"a": [1, 2', '"[[[[' + "[" * 300 + '"x'):
        with pytest.raises(RunStoreError) as err:
            s.runs.create(fresh("bad"), text)
        expected = "exceeds the depth limit" if text == "[" * 300 else "is not valid JSON"
        assert expected in str(err.value), (text[:10], str(err.value))


@pytest.mark.parametrize("field", ["meta", "checkpoint", "error", "outcome"])
@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_put_and_finish_of_a_non_finite_float_name_the_rule_not_the_value(owned, field: str, number: float) -> None:
    """A NaN or infinite float anywhere in an attempt's value is refused naming the field and the rule
    (as heartbeat and patch do), not only "violates the persistence contract"; the value is not
    echoed and the refusal has no cause (AS-16). The identity refusal keeps its exact text (AS-15)."""
    s, rid = owned
    value = {"ratio": [1, number]}
    with pytest.raises(AttemptStoreError) as err:
        s.attempts.put(_attempt(rid, **{field: value}), OWN)
    assert str(err.value) == f"invalid_attempt: AttemptStore.put: attempt violates the persistence contract: " \
                             f"{field} contains a non-finite number"
    assert err.value.cause == {}
    assert s.attempts.get(rid, "digest-1", 0) is None
    s.attempts.put(_attempt(rid), OWN)
    with pytest.raises(AttemptStoreError) as err:
        s.attempts.finish(_attempt(rid, state="completed", finished_at_ms=20, **{field: value}), OWN)
    assert str(err.value) == f"invalid_attempt: AttemptStore.finish: finished attempt violates the contract: " \
                             f"{field} contains a non-finite number"
    assert "nan" not in str(err.value).lower() and "inf" not in str(err.value).replace("finite", "")
    assert s.attempts.get(rid, "digest-1", 0) == _attempt(rid)
