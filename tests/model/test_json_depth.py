"""`json_depth.loads` parses with pydantic-core first and hands what it refuses to
`json.loads`: every text gives the value, or the error, `json.loads` gives (as before the fast
parser), and nesting past `MAX_JSON_DEPTH` is `JsonTooDeep` either way."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.model.json_depth import MAX_JSON_DEPTH, JsonTooDeep, loads

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values, with the types json.loads gives (1 is not 1.0, nan is nan)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.booleans(), st.booleans())
def test_any_json_value_parses_as_json_loads_parses_it(value: Any, ascii_only: bool,
                                                       as_bytes: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    data: str | bytes = text.encode("utf-8", "surrogatepass") if as_bytes else text
    assert same(loads(data), json.loads(data))


@pytest.mark.parametrize("data", [
    b'"\\ud834"',  # a lone surrogate escape: the fast parser refuses it
    '"\\udc80 and more"',
    b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 byte-order mark (json.loads skips it in bytes)
    '{"a": [1, 2]}'.encode("utf-16"),  # UTF-16 with its BOM
    '{"a": [1, 2]}'.encode("utf-32-le"),
    b'[NaN, Infinity, -Infinity, 1e400, -0.0]',
    b'123456789012345678901234567890123456789',
    b'{"a": 1, "a": 2}',  # the last one wins, in both
    b' {"a": "x"}\n',
])
def test_texts_the_fast_parser_refuses_or_reads_differently_parse_as_before(
    data: str | bytes,
) -> None:
    assert same(loads(data), json.loads(data))


@pytest.mark.parametrize("data", [
    b'{"a": 1', b'[1,]', b"{'a': 1}", b'"a\nb"', b'"\x00"', b'{"a": 1} x', b'', b'tru',
    b'"\xff"',
])
def test_malformed_text_fails_with_the_error_json_loads_gives(data: bytes) -> None:
    with pytest.raises(ValueError) as expected:
        json.loads(data)
    with pytest.raises(ValueError) as got:
        loads(data)
    assert type(got.value) is type(expected.value) and str(got.value) == str(expected.value)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 199, 201, 1_000, 100_000])
def test_too_deep_is_too_deep_on_either_parser(depth: int) -> None:
    with pytest.raises(JsonTooDeep):
        loads("[" * depth + "]" * depth)
    assert loads("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
