"""Durable values: what may cross the persistence boundary (seed ``durable-values.md``).

Only exact ``dict`` (str keys), ``list``, ``str``, ``int``, finite ``float``, ``bool`` and ``None``
are durable, with no cycles, no lone surrogate and no NUL in any string or key. Depth and node counts
are bounded; there is no byte bound except on checkpoints. Every refusal names the rule and the limit
or length, never the value, because it reaches logs and spans.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, NoReturn, TypeGuard

import msgspec

SAFE_MAX = 9_007_199_254_740_991
MAXIMUM_JSON_DEPTH = 128
MAXIMUM_JSON_NODES = 100_000
MAXIMUM_IDENTIFIER_UNITS = 1024

Fail = Callable[[str], NoReturn]

_json_decoder = msgspec.json.Decoder()
_json_encoder = msgspec.json.Encoder()


class ValueRefused(ValueError):
    """Internal: a durable-value rule was broken; ``str()`` is a value-free complaint."""


def utf16_units(text: str) -> int:
    """Length of ``text`` in UTF-16 code units (an astral character counts 2)."""
    n = len(text)
    if text.isascii():
        return n
    return n + sum(1 for ch in text if ord(ch) > 0xFFFF)


def text_problem(text: str) -> str | None:
    """Return the broken text rule (``contains NUL`` / ``contains a lone surrogate``) or None."""
    if "\x00" in text:
        return "contains NUL"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate"
    return None


def identifier_problem(value: object) -> str | None:
    """Why ``value`` is not a durable identifier (1..1024 UTF-16 units, no NUL, no lone surrogate)."""
    # Nearly every identifier is short ASCII: one UTF-16 unit per character, no surrogate possible.
    if type(value) is str and value.isascii() and 0 < len(value) <= MAXIMUM_IDENTIFIER_UNITS and "\x00" not in value:
        return None
    if type(value) is not str:
        return "must be a string"
    if not value:
        return "must not be empty"
    if len(value) > MAXIMUM_IDENTIFIER_UNITS or utf16_units(value) > MAXIMUM_IDENTIFIER_UNITS:
        return f"must be at most {MAXIMUM_IDENTIFIER_UNITS} UTF-16 units (got {utf16_units(value)})"
    return text_problem(value)


def ascii_digits(text: str, max_len: int | None = None) -> bool:
    """True when ``text`` is one or more ASCII digits (at most ``max_len`` of them when given).

    ``str.isdigit`` alone admits "²" and other scripts' digits, which ``int`` refuses; a bound on
    the length keeps ``int`` from refusing thousands of digits as well.
    """
    return text.isascii() and text.isdigit() and (max_len is None or len(text) <= max_len)


def is_safe_int(value: object) -> TypeGuard[int]:
    """True for an exact ``int`` (never ``bool``) in ``0 ..= 2**53 - 1``."""
    return type(value) is int and 0 <= value <= SAFE_MAX


#: The most decimal digits an integer in a durable value may have: what Python converts to text by
#: default (``sys.get_int_max_str_digits``); a longer one cannot be encoded as JSON here.
MAX_INT_DIGITS = 4300
# 2**SURE_BITS has MAX_INT_DIGITS digits: any integer of fewer bits has at most that many.
SURE_BITS = 14_284


def int_digits_ok(v: int) -> bool:
    """Whether ``v`` has at most ``MAX_INT_DIGITS`` decimal digits."""
    bits = v.bit_length()
    return bits <= SURE_BITS or (bits <= SURE_BITS + 4 and abs(v) < 10**MAX_INT_DIGITS)


def _value_problem(value: Any, max_depth: int, max_nodes: int) -> str | None:
    nodes = 0
    on_path: set[int] = set()

    def walk(v: Any, depth: int) -> str | None:
        nonlocal nodes
        nodes += 1
        if nodes > max_nodes:
            return f"exceeds the node limit of {max_nodes}"
        t = type(v)
        if v is None or t is bool:
            return None
        if t is int:
            return None if int_digits_ok(v) else f"contains an integer of more than {MAX_INT_DIGITS} digits"
        if t is str:
            p = text_problem(v)
            return f"string {p}" if p else None
        if t is float:
            return None if math.isfinite(v) else "contains a non-finite number"
        if t is dict or t is list:
            if depth + 1 > max_depth:
                return f"exceeds the depth limit of {max_depth}"
            ident = id(v)
            if ident in on_path:
                return "contains a cycle"
            on_path.add(ident)
            try:
                if t is dict:
                    for k, item in v.items():
                        if type(k) is not str:
                            return "has a key that is not a string"
                        p = text_problem(k)
                        if p:
                            return f"key {p}"
                        nodes += 1
                        if nodes > max_nodes:
                            return f"exceeds the node limit of {max_nodes}"
                        r = walk(item, depth + 1)
                        if r:
                            return r
                else:
                    for item in v:
                        r = walk(item, depth + 1)
                        if r:
                            return r
            finally:
                on_path.discard(ident)
            return None
        return f"holds a value of type {t.__name__}, which is not durable"

    return walk(value, 0)


def value_problem(value: Any, *, max_depth: int = MAXIMUM_JSON_DEPTH,
                  max_nodes: int = MAXIMUM_JSON_NODES) -> str | None:
    """Why ``value`` is not a durable value, or None."""
    return _value_problem(value, max_depth, max_nodes)


def parse_json_text(text: object, *, max_depth: int = MAXIMUM_JSON_DEPTH,
                    max_nodes: int = MAXIMUM_JSON_NODES) -> tuple[Any, str | None]:
    """Decode JSON text under the durable-value rules; return ``(value, problem)``.

    ``NaN``/``Infinity`` literals are refused (msgspec's decoder never accepts them), and so
    are escapes that decode to a lone surrogate or NUL, and an object that repeats a key (a decoder
    keeps one of the values and drops the others without a word).
    """
    if type(text) is not str:
        return None, "must be a string of JSON text"
    p = text_problem(text)
    if p:
        return None, f"text {p}"
    try:
        value = _json_decoder.decode(text)
    except RecursionError:
        # Nesting deeper than the decoder's own recursion bound: that is the depth limit broken.
        return None, f"exceeds the depth limit of {max_depth}"
    except msgspec.DecodeError:
        if _nesting_exceeds(text, max_depth):
            return None, f"exceeds the depth limit of {max_depth}"
        return None, "is not valid JSON"
    except UnicodeDecodeError:  # pragma: no cover - msgspec reports escapes as DecodeError
        return None, "is not valid JSON"
    if _within_bounds_by_text(text, max_depth, max_nodes):
        problem = None
    else:
        problem = _value_problem(value, max_depth, max_nodes)
    if problem is None and _repeats_a_key(text, value):
        problem = REPEATED_KEY
    return value, problem


REPEATED_KEY = "has an object that repeats a key"
_STRINGS = re.compile(r'"[^"]*"')


class _RepeatedKey(Exception):
    pass


def _pairs_once(pairs: list[tuple[str, Any]]) -> None:
    if len({k for k, _ in pairs}) != len(pairs):
        raise _RepeatedKey
    return None


def _repeats_a_key(text: str, value: Any) -> bool:
    """True when an object in the JSON ``text`` (which decoded to ``value``) names a key twice.

    Every key in the text is followed by one colon; colons inside strings only add to the count.
    So a text with as many colons as ``value`` has keys repeats none, proven without parsing again
    (the common case). Otherwise the colons inside strings are counted out, which needs no parse
    while the text has no backslash (then no string holds a quote); with one, the text is parsed
    once more, keeping each object's pairs.
    """
    colons = text.count(":")
    if colons < 2:  # a repeat takes two keys
        return False
    # One object in all (the usual flat state): its own keys are all the keys there are.
    keys = len(value) if type(value) is dict and text.count("{") == 1 else _key_count(value)
    if keys == colons:
        return False
    if "\\" not in text:  # no escape, so no quote inside a string: each "..." is one whole string
        return keys != colons - sum(string.count(":") for string in _STRINGS.findall(text))
    try:  # numbers are not converted: the text was valid JSON already, only the keys matter here
        json.loads(text, object_pairs_hook=_pairs_once, parse_int=_ignore, parse_float=_ignore)
    except _RepeatedKey:
        return True
    return False


def _key_count(value: Any) -> int:
    """How many keys the objects in a decoded JSON value hold, all told (its depth is bounded)."""
    t = type(value)
    if t is dict:
        n = len(value)
        items = value.values()
    elif t is list:
        n = 0
        items = value
    else:
        return 0
    for item in items:
        if type(item) is dict or type(item) is list:
            n += _key_count(item)
    return n


def _ignore(text: str) -> None:
    return None


# An escape that could decode to NUL or to a lone surrogate (a valid pair matches too: slow path).
_HAZARD_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def _within_bounds_by_text(text: str, max_depth: int, max_nodes: int) -> bool:
    """True when the text alone proves that the value decoded from it breaks no durable rule.

    Decoded JSON has only JSON types, string keys, no cycles and (msgspec refuses out-of-range
    numbers) no infinities; raw NUL and lone surrogates were refused on the text. What remains is
    depth, node count and escapes. Opening brackets bound the nesting depth, and commas + colons +
    openings + 1 bound the node count (characters inside strings only raise both bounds), so a
    small value is proven without walking it; anything else takes the full walk.
    """
    opens = text.count("[") + text.count("{")
    if opens > max_depth or opens + text.count(",") + text.count(":") + 1 > max_nodes:
        return False
    return "\\u" not in text or _HAZARD_ESCAPE.search(text) is None


def _nesting_exceeds(text: str, max_depth: int) -> bool:
    """True when JSON-like ``text`` opens more than ``max_depth`` containers at once (strings skipped)."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def encode_json(value: Any) -> str:
    """Canonical-enough JSON text for a value that already passed ``value_problem``."""
    return _json_encoder.encode(value).decode("utf-8")


#: ``canonical_json(value)``: JSON bytes with sorted keys, the bytes hashes and content comparisons
#: are made over. One reused encoder, called directly: an append encodes three times (its payload
#: and both hashes), and ``msgspec.json.encode(value, order=...)`` sets up an encoder per call.
canonical_json: Callable[[Any], bytes] = msgspec.json.Encoder(order="sorted").encode


def json_equal(a: Any, b: Any) -> bool:
    """Structural JSON equality: key order ignored, array order kept, ``true`` never equals ``1``.

    ``1`` and ``1.0`` are the same JSON number (as in JavaScript, where upstream runs); see
    docs/decisions.md.
    """
    ta, tb = type(a), type(b)
    if ta is bool or tb is bool:
        return ta is tb and a == b
    if ta in (int, float) and tb in (int, float):
        return a == b
    if ta is not tb:
        return False
    if ta is dict:
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if ta is list:
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# ---------------------------------------------------------------------------- call arguments
# Arguments of long-running calls (workers, builders, followers), checked when the call is made so a
# bad one is refused before anything is claimed or written. Each returns the broken rule (the caller
# prefixes the argument's name and raises its own error class), never the value.

STOP_RULE = "must be a threading.Event (anything with an is_set() method) or None"


def stop_problem(value: object) -> str | None:
    """Why ``value`` cannot be a ``stop`` signal, or None: it may be None or have a callable ``is_set``."""
    if value is None or callable(getattr(value, "is_set", None)):
        return None
    return STOP_RULE


def seconds_problem(value: object, *, allow_zero: bool, maximum: float | None = None) -> str | None:
    """Why ``value`` is not a finite number of seconds (``> 0``, or ``>= 0`` with ``allow_zero``;
    at most ``maximum`` when given), or None. ``bool`` is not a number here."""
    low = ">= 0" if allow_zero else "> 0"
    rule = f"must be a finite number of seconds {low}" + ("" if maximum is None else f" and <= {maximum:g}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return rule
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        return rule
    if maximum is not None and value > maximum:
        return rule
    return None
