"""Defect (found by a review, SQLite and PostgreSQL): the worker stored a result whose dict keys
were not strings by turning them into strings (``{1: "x"}`` was stored as ``{"1":"x"}``, so the
resumed state had another key), and ``{1: "a", "1": "b"}`` as JSON text naming ``"1"`` twice, one
value lost on every read. The run store took such text too: ``runs.create`` and
``transition_owned`` accepted ``'{"a":1,"a":2}'``.

Now a value with a key that is not a string (an int, a float, a bool), or whose keys would be
stored as the same string, settles the run ``failed`` with ``UnstorableResult`` naming the rule,
as a tuple key already did; and state text whose object repeats a key is refused as
``invalid_run`` naming the field (never the value), with nothing written.
"""

from __future__ import annotations

import enum

import pytest

import fencepost
from fencepost import OwnerId, RunStoreError
from fencepost._values import parse_json_text
from fencepost.worker import RunContext, Suspend, Worker

ME = OwnerId("host-a", 1, "n-1")
SECRET = "SECRET-VALUE-42"


class Colour(enum.Enum):
    RED = "red"


RESULTS = {
    "int-key": {1: "x"},
    "int-and-str-key": {1: "a", "1": SECRET},
    "nested-float-key": {"outer": [{2.5: "y"}]},
    "bool-key": {True: "t"},
    "enum-colliding": {Colour.RED: 1, "red": SECRET},
}


@pytest.mark.parametrize("how", ["return", "checkpoint", "suspend"])
@pytest.mark.parametrize("name", list(RESULTS), ids=list(RESULTS))
def test_a_value_whose_keys_are_not_distinct_strings_fails_the_run_unstorable(store, name, how):
    store.runs.create("r1", '{"v":0}')

    def fn(ctx: RunContext):
        value = RESULTS[name]
        if how == "checkpoint":
            ctx.checkpoint(value)
        if how == "suspend":
            raise Suspend(value)
        return value

    stats = Worker(store, fn, concurrency=1).run(until_idle=True)
    row = store.runs.get("r1")
    assert (row.status, stats.failed) == ("failed", 1), row
    assert row.failure.type == "fencepost.worker.UnstorableResult", row.failure
    assert "key" in row.failure.message and SECRET not in row.failure.message
    assert row.state_json == '{"v":0}'  # the last checkpoint stands


def test_keys_that_are_strings_are_stored_as_they_are(store):
    store.runs.create("r1", "{}")
    value = {"1": "a", "nested": [{"k": 1}, {"k": 2}], "url": "http://h:1/x"}
    Worker(store, lambda ctx: value, concurrency=1).run(until_idle=True)
    row = store.runs.get("r1")
    assert row.status == "completed" and fencepost.worker._decode.decode(row.state_json) == value


REPEATS = ['{"a":1,"a":2}', '{"x":{"k":"first","k":"' + SECRET + '"}}', '[{"q":[{"b":1,"b":1}]}]',
           '{"a":1,"\\u0061":2}', '{"u":"a:b:c","u":1}', '{ "a" : 1 , "a" : 2 }']


@pytest.mark.parametrize("text", REPEATS)
def test_create_refuses_state_text_that_repeats_a_key_and_writes_nothing(store, text):
    with pytest.raises(RunStoreError) as err:
        store.runs.create("r1", text)
    assert err.value.code == "invalid_run" and "state_json" in str(err.value)
    assert "repeats a key" in str(err.value) and SECRET not in str(err.value)
    with pytest.raises(RunStoreError):
        store.runs.get("r1")


@pytest.mark.parametrize("text", REPEATS)
def test_transition_owned_refuses_state_text_that_repeats_a_key_and_changes_nothing(store, clock, text):
    store.runs.create("r1", '{"v":0}')
    store.runs.claim_and_own("r1", store.runs.get("r1").snapshot(), ME, clock.now_ms())
    before = store.runs.get("r1")
    with pytest.raises(RunStoreError) as err:
        store.runs.transition_owned("r1", ME, "running", text)
    assert err.value.code == "invalid_run" and "state_json" in str(err.value) and SECRET not in str(err.value)
    assert store.runs.get("r1") == before


@pytest.mark.parametrize("text", ['{"a":1,"b":2}', '[{"a":1},{"a":2}]', '{"a":"x:y","b":{"c":"::"}}',
                                  '{"a":"q\\"","b":":"}', '{"a":{"b":1},"c":{"b":2}}', "{}", "[]", '"a:b"'])
def test_parse_json_text_admits_distinct_keys(text):
    assert parse_json_text(text)[1] is None


@pytest.mark.parametrize("text", REPEATS)
def test_parse_json_text_names_a_repeated_key(text):
    assert parse_json_text(text)[1] == "has an object that repeats a key"
