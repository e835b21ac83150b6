"""JSON from outside the daemon, with a nesting limit.

`json.loads` recurses once per nesting level: a 2,000-byte line of arrays nested 1,000 deep
raises `RecursionError` (not a `ValueError`), and values nested a few hundred deep break later
recursive steps (schema validation, encoding the stored outcome). Every request body, wire
message and string-encoded tool input is parsed here instead, so that too deep is an ordinary
parse error the caller answers like any other malformed JSON (JSON-RPC -32700, HTTP 400,
`invalid_input`).

The check is nearly free for ordinary messages: a text with at most `MAX_JSON_DEPTH` opening
brackets cannot nest deeper, and only longer ones get a walk of the parsed value.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import from_json

MAX_JSON_DEPTH = 64


class JsonTooDeep(ValueError):
    """The JSON nests arrays/objects more than `MAX_JSON_DEPTH` levels deep."""

    def __init__(self) -> None:
        super().__init__(f"the JSON nests arrays and objects more than {MAX_JSON_DEPTH} levels "
                         "deep")


def loads(data: str | bytes | bytearray) -> Any:
    """`json.loads(data)`, raising `JsonTooDeep` (a `ValueError`, like every parse error) for
    a value nested more than `MAX_JSON_DEPTH` levels.

    pydantic-core's parser reads it first (one call, no Python frames: a request line in a
    third of the time); whatever it refuses goes to `json.loads`, so a text parses to the
    same value, or fails with the same error, as before: a lone surrogate escape, a
    byte-order mark, UTF-16 or UTF-32 bytes, nesting past its own limit (200), and malformed
    text."""
    try:
        value = from_json(data)
    except ValueError:
        try:
            value = json.loads(data)
        except RecursionError:
            raise JsonTooDeep() from None
    if _openings(data) > MAX_JSON_DEPTH:
        check_depth(value)
    return value


def check_depth(value: Any) -> None:
    """Raise `JsonTooDeep` when `value` (parsed JSON) nests deeper than the limit. Iterative:
    a value nested deeper than the interpreter's recursion limit is measured too."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise JsonTooDeep()
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))


def may_be_too_deep(data: str | bytes | bytearray) -> bool:
    """False when `data` cannot nest deeper than `MAX_JSON_DEPTH` (it has no more opening
    brackets than that: a count, no parse); True when only a parse can tell (`loads`)."""
    return _openings(data) > MAX_JSON_DEPTH


def _openings(data: str | bytes | bytearray) -> int:
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")
