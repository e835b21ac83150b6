"""`json_text.compact`: the call path's JSON texts, and where it leaves the answer to the
standard library's encoder (None), which the call sites then use."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.model.json_text import compact


@pytest.mark.parametrize("value", [
    {"jsonrpc": "2.0", "id": "mcp-sidecar/7", "method": "tools/call",
     "params": {"name": "echo", "arguments": {"text": "héllo 😀", "n": 10**30, "x": None}}},
    ["default", "call-1", "echo", "ab12", 1733480000.25],
    {"nested": [[1, 2.5, True], {"deep": {"er": []}}]},
])
def test_plain_json_is_compact_utf8_that_reads_back_equal(value: Any) -> None:
    data = compact(value)
    assert data is not None
    assert json.loads(data) == value
    assert data == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def test_what_utf8_json_cannot_hold_is_left_to_the_standard_library() -> None:
    assert compact({"text": "\ud800"}) is None  # a lone surrogate
    circular: list[Any] = []
    circular.append(circular)
    assert compact(circular) is None
    assert compact({"value": object()}) is None


def test_nan_is_refused_only_when_asked() -> None:
    assert compact([float("nan")]) == b"[NaN]"  # as json.dumps writes it
    assert compact([float("inf")], allow_nan=False) is None
    # the check reads the text: a string spelling one is also left to the standard library
    assert compact({"word": "NaN"}, allow_nan=False) is None
    assert compact({"word": "nan"}, allow_nan=False) == b'{"word":"nan"}'
