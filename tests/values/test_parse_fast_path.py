"""``parse_json_text`` proves small values durable from the text alone; the verdict must equal the walk's."""

from __future__ import annotations

import json

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost._values import _value_problem, parse_json_text

_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                  st.text(alphabet=st.sampled_from("ab\x00\ud800\U0001f600,:[]{}\\\"u0")))
_json = st.recursive(_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=3), inner, max_size=4)),
                     max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_json, st.integers(1, 6), st.integers(1, 40))
def test_fast_path_verdict_equals_the_full_walk(value, max_depth: int, max_nodes: int) -> None:
    text = json.dumps(value, ensure_ascii=True)  # NUL and surrogates arrive as escapes
    try:
        msgspec.json.decode(text)
    except msgspec.DecodeError:  # a lone surrogate escape msgspec refuses to decode: no value to walk
        return
    decoded, problem = parse_json_text(text, max_depth=max_depth, max_nodes=max_nodes)
    assert problem == _value_problem(decoded, max_depth, max_nodes)


def test_escaped_nul_and_depth_are_refused_even_in_small_texts() -> None:
    assert parse_json_text('{"a": "\\u0000"}')[1] == "string contains NUL"
    assert parse_json_text('{"a\\u0000": 1}')[1] == "key contains NUL"
    assert parse_json_text("[" * 129 + "]" * 129)[1] == "exceeds the depth limit of 128"
    assert parse_json_text("[" * 128 + "]" * 128)[1] is None
    assert parse_json_text('{"s": "\\\\u0000"}')[1] is None  # an escaped backslash, not a NUL
