"""`loads_in_pieces`: the value `json.loads` gives, in steps of at most a window; the same
errors (as `ValueError`s with a position). Windows are shrunk so that every shape is walked."""

from __future__ import annotations

import json
import random

import pytest

from bridges.mcp import piecewise_json
from bridges.mcp.piecewise_json import loads_in_pieces
from tests.bridges.test_framing import _random_value


@pytest.mark.parametrize("window", [16, 300, 64 * 1024])
def test_it_parses_what_json_loads_parses(monkeypatch, window):
    monkeypatch.setattr(piecewise_json, "WINDOW", window)
    monkeypatch.setattr(piecewise_json, "_FIRST_TRY", min(window, 16))
    rnd = random.Random(window)
    for _ in range(400):
        value = _random_value(rnd)
        text = json.dumps(value, ensure_ascii=rnd.random() < 0.5,
                          indent=rnd.choice([None, 1]))
        assert loads_in_pieces(f" {text}\n") == json.loads(text)


_PUNCTUATION = [",", "[", "]", "{", "}", ":", '"', "\\", " ", "a", "1", "é"]


def _punctuated(rnd: random.Random, depth: int = 0) -> object:
    """Values whose strings and keys are full of JSON's own punctuation, the characters a
    run's cut (`piecewise_json._run`) must never be fooled by."""
    pick = rnd.random()
    if depth > 4 or pick < 0.4:
        return "".join(rnd.choice(_PUNCTUATION) for _ in range(rnd.randint(0, 12)))
    if pick < 0.55:
        return rnd.choice([0, -1, 2.5, 1e30, True, None])
    if pick < 0.8:
        return [_punctuated(rnd, depth + 1) for _ in range(rnd.randint(0, 6))]
    return {str(_punctuated(rnd, 5)): _punctuated(rnd, depth + 1)
            for _ in range(rnd.randint(0, 6))}


@pytest.mark.parametrize("window", [8, 40, 200])
def test_runs_of_members_are_never_cut_inside_a_value(monkeypatch, window):
    monkeypatch.setattr(piecewise_json, "WINDOW", window)
    monkeypatch.setattr(piecewise_json, "_FIRST_TRY", min(window, 16))
    rnd = random.Random(window * 7)
    for _ in range(1500):
        value = _punctuated(rnd)
        text = json.dumps(value, ensure_ascii=rnd.random() < 0.5,
                          separators=rnd.choice([(",", ":"), (", ", ": ")]))
        assert loads_in_pieces(text) == json.loads(text), text


def test_no_c_call_parses_more_than_a_window(monkeypatch):
    """Every container the C scanner is given is a slice of at most `WINDOW` characters (the
    scalars it reads in the whole text are one value each), runs of members included."""
    seen: list[int] = []
    scan = piecewise_json._scan_once

    def counted(text: str, index: int) -> tuple[object, int]:
        value, end = scan(text, index)
        if isinstance(value, dict | list):
            seen.append(end - index)
        return value, end

    monkeypatch.setattr(piecewise_json, "_scan_once", counted)
    tools = [{"name": f"t{k}", "inputSchema": {"properties": {
        f"p{i}": {"type": "string"} for i in range(300)}}} for k in range(200)]
    message = {"jsonrpc": "2.0", "id": 1, "result": {"tools": tools, "flat": list(range(9999))}}
    text = json.dumps(message)
    assert len(text) > 20 * piecewise_json.WINDOW
    assert loads_in_pieces(text) == message
    assert seen and max(seen) <= piecewise_json.WINDOW


@pytest.mark.parametrize(("text", "said"), [
    ('{"a": [1, 2', "expecting ',' or ']'"),
    ("[1,,2]", "expecting a value"),
    ('{"a" 1}', "expecting ':'"),
    ('{"a": 1} x', "extra data"),
    ("", "expecting a value"),
    ('{"a": 1,}', "expecting a property name"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_what_is_not_json_is_a_value_error(monkeypatch, text, said):
    monkeypatch.setattr(piecewise_json, "WINDOW", 16)
    monkeypatch.setattr(piecewise_json, "_FIRST_TRY", 16)
    with pytest.raises(ValueError, match=said):
        loads_in_pieces(text)
