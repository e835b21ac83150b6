"""JSON parsed in bounded steps, for a worker thread that must not starve the event loop.
Imports nothing of ours; exports `loads_in_pieces` (its cost: its docstring) and `WINDOW`.

`json.loads` is one C call: it holds the interpreter lock from the first byte to the last, so
parsing a 50 MB `tools/list` answer in a thread stops the event loop as surely as parsing it
on the loop (the other thread gets the lock back only between two bytecodes).
`loads_in_pieces` gives the same value, but no single C call parses more than `WINDOW`
characters (plus one scalar): a container that does not close within a window is walked in
Python, member by member, and each member that fits in a window is parsed whole by the C
scanner. Between steps the interpreter hands the lock to the event loop's thread
(`sys.getswitchinterval()`, 5 ms), so the loop keeps answering while the worker parses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

WINDOW = 64 * 1024
"""The most characters one C call parses (besides one scalar)."""
_FIRST_TRY = 256
_GROWTH = 16
MAX_WALKED_DEPTH = 256
"""How many containers larger than a window may nest (inside one, the C parser's own limit)."""

_DECODER = json.JSONDecoder()
_scan_once: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_WHITESPACE = re.compile(r"[ \t\n\r]*")


def loads_in_pieces(text: str) -> Any:
    """`json.loads(text)` in steps of at most `WINDOW` characters; raises `ValueError` (with
    the character position) for text that is not one JSON value, nested too deeply included.

    Cost: about that of `json.loads` plus a few percent (each member is tried in windows that grow
    by 16x, a failed try costs at most its window; consecutive members that fit in a window are
    parsed together, `_run`), and Python steps only for members larger than a window. Strings
    are parsed whole (a long string is one C call; the stdio framer decodes long strings on
    arrival and leaves only the rest to this).
    """
    try:
        value, end = _value(text, _skip(text, 0), 0)
    except RecursionError:  # inside a window: the C parser's own limit
        raise ValueError("nested too deeply") from None
    end = _skip(text, end)
    if end != len(text):
        raise ValueError(f"extra data at character {end}")
    return value


def _skip(text: str, index: int) -> int:
    match = _WHITESPACE.match(text, index)
    return match.end() if match is not None else index


def _value(text: str, index: int, depth: int) -> tuple[Any, int]:
    first = text[index : index + 1]
    if first in ("{", "["):
        whole = _within_window(text, index)
        if whole is not None:
            return whole
        if depth >= MAX_WALKED_DEPTH:
            raise ValueError("nested too deeply")
        return (_object if first == "{" else _array)(text, index + 1, depth + 1)
    try:
        return _scan_once(text, index)
    except StopIteration:
        raise ValueError(f"expecting a value at character {index}") from None


def _within_window(text: str, index: int) -> tuple[Any, int] | None:
    """The container at `index` parsed in one C call, if it closes within `WINDOW`."""
    size = _FIRST_TRY
    while True:
        piece = text[index : index + size]
        try:
            value, end = _scan_once(piece, 0)
        except StopIteration:
            value, end = None, -1
        except ValueError:  # a string or number cut by the window's end, or a real error
            value, end = None, -1
        if end >= 0:
            return value, index + end
        if len(piece) < size or size >= WINDOW:  # the text ends (a real error) or too big
            return None
        size *= _GROWTH


def _run(text: str, index: int, opener: str, closer: str) -> tuple[Any, int] | None:
    """The members of a container from `index` up to the last comma within a window, parsed
    in one C call as `opener + members + closer` (None if that is not valid JSON), and the
    index after that comma.

    Valid JSON means the cut is a comma between members: a comma inside a string leaves the
    string open, one inside a nested container leaves it unclosed, and a closer inside the
    members ends the value before the end (all refused). So a run of small members costs one
    C call, not a Python step each."""
    piece = text[index : index + WINDOW - 1]  # with the opener and closer: one window
    cut = piece.rfind(",")
    if cut <= 0:
        return None
    candidate = opener + piece[:cut] + closer
    try:
        value, end = _scan_once(candidate, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(candidate):
        return None
    return value, index + cut + 1


class _Runs:
    """When to try `_run` in one container: after a failed try (its members are too large,
    or nested) the next tries wait for 2, 4, 8, ... members, so a container of large members
    pays for a few failed windows, not one per member."""

    __slots__ = ("_misses", "_wait")

    def __init__(self) -> None:
        self._misses = 0
        self._wait = 0

    def attempt(self, text: str, index: int, opener: str, closer: str) -> tuple[Any, int] | None:
        if self._wait > 0:
            self._wait -= 1
            return None
        run = _run(text, index, opener, closer)
        if run is None:
            self._misses = min(self._misses + 1, 20)
            self._wait = 1 << self._misses
        else:
            self._misses = 0
        return run


def _object(text: str, index: int, depth: int) -> tuple[dict[str, Any], int]:
    result: dict[str, Any] = {}
    index = _skip(text, index)
    if text[index : index + 1] == "}":
        return result, index + 1
    runs = _Runs()
    while True:
        run = runs.attempt(text, index, "{", "}")
        if run is not None:
            members, index = run
            result.update(members)
            index = _skip(text, index)
            continue
        if text[index : index + 1] != '"':
            raise ValueError(f"expecting a property name in double quotes at character {index}")
        key, index = _scanstring(text, index + 1)
        index = _skip(text, index)
        if text[index : index + 1] != ":":
            raise ValueError(f"expecting ':' at character {index}")
        result[key], index = _value(text, _skip(text, index + 1), depth)
        index = _skip(text, index)
        separator = text[index : index + 1]
        if separator == "}":
            return result, index + 1
        if separator != ",":
            raise ValueError(f"expecting ',' or '}}' at character {index}")
        index = _skip(text, index + 1)


def _array(text: str, index: int, depth: int) -> tuple[list[Any], int]:
    result: list[Any] = []
    index = _skip(text, index)
    if text[index : index + 1] == "]":
        return result, index + 1
    runs = _Runs()
    while True:
        run = runs.attempt(text, index, "[", "]")
        if run is not None:
            items, index = run
            result.extend(items)
            index = _skip(text, index)
            continue
        item, index = _value(text, index, depth)
        result.append(item)
        index = _skip(text, index)
        separator = text[index : index + 1]
        if separator == "]":
            return result, index + 1
        if separator != ",":
            raise ValueError(f"expecting ',' or ']' at character {index}")
        index = _skip(text, index + 1)
