"""Durable values (seed durable-values.md): exact types, shape limits, text rules, identifiers."""

from __future__ import annotations

import pytest

from fencepost import _values as v


@pytest.mark.parametrize("ident", ["run-\ufffd", "run-😀", "a", "x" * 1024, "😀" * 512])
def test_valid_identifiers(ident: str) -> None:
    """RS-04/RS-05: U+FFFD and astral characters are ordinary text."""
    assert v.identifier_problem(ident) is None


@pytest.mark.parametrize(
    ("ident", "rule"),
    [
        ("", "empty"),
        ("run-\ud800", "lone surrogate"),
        ("run-\udc00", "lone surrogate"),
        ("a\x00b", "NUL"),
        ("x" * 1025, "1024"),
        ("😀" * 513, "1024"),
        (1, "string"),
        (type("S", (str,), {})("abc"), "string"),
    ],
    ids=["empty", "high-surrogate", "low-surrogate", "nul", "too-long", "astral-too-long", "int", "str-subclass"],
)
def test_invalid_identifiers_name_the_rule(ident: object, rule: str) -> None:
    problem = v.identifier_problem(ident)
    assert problem is not None and rule in problem


def test_utf16_units_count_astral_characters_twice() -> None:
    assert v.utf16_units("a😀") == 3


@pytest.mark.parametrize("value", [0, v.SAFE_MAX])
def test_safe_ints(value: int) -> None:
    assert v.is_safe_int(value)


@pytest.mark.parametrize("value", [-1, v.SAFE_MAX + 1, True, 1.0, "1", None])
def test_unsafe_ints(value: object) -> None:
    assert not v.is_safe_int(value)


def _nest(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def test_depth_limit_is_128_containers() -> None:
    assert v.value_problem(_nest(128)) is None
    assert "depth limit of 128" in (v.value_problem(_nest(129)) or "")


def test_node_limit_is_100000() -> None:
    assert v.value_problem([0] * 99_999) is None
    assert "node limit of 100000" in (v.value_problem([0] * 100_000) or "")


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (float("nan"), "non-finite"),
        (float("inf"), "non-finite"),
        ({1: "a"}, "key that is not a string"),
        ({"a\ud800": 1}, "lone surrogate"),
        (["\x00"], "NUL"),
        ((1, 2), "tuple"),
        (type("D", (dict,), {})(), "D"),
        (object(), "object"),
    ],
    ids=["nan", "inf", "int-key", "surrogate-key", "nul-string", "tuple", "dict-subclass", "object"],
)
def test_non_durable_values_are_refused_by_rule(value: object, rule: str) -> None:
    problem = v.value_problem(value)
    assert problem is not None and rule in problem


def test_cycles_are_refused_but_shared_references_are_fine() -> None:
    shared = {"a": 1}
    assert v.value_problem([shared, shared]) is None
    loop: list = []
    loop.append(loop)
    assert v.value_problem(loop) == "contains a cycle"


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", "-Infinity", "not-json", '"\\ud800"', '{"a":"\\u0000"}', 42])
def test_state_text_refusals(text: object) -> None:
    _, problem = v.parse_json_text(text)
    assert problem is not None


def test_state_text_never_echoes_the_value() -> None:
    secret = "sk-live-" + "x" * 40
    _, problem = v.parse_json_text('{"k": "' + secret + '"')
    assert problem is not None and secret not in problem


def test_json_equal_never_equates_true_with_one_but_equates_1_and_1_0() -> None:
    assert not v.json_equal(True, 1)
    assert not v.json_equal({"a": [True]}, {"a": [1]})
    assert v.json_equal(1, 1.0)
    assert v.json_equal({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1})
    assert not v.json_equal([1, 2], [2, 1])
