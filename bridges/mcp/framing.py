"""Newline-delimited JSON-RPC framing for stdio, in linear time and with few copies.

The SDK's stdio reader does `(buffer + chunk).split("\\n")` for every chunk, so a message of n
bytes costs O(n^2) (a 100 MB result took 87 s). `LineFramer` scans each byte once: chunks of an
unfinished line are kept in a list and joined once, when the newline arrives.

Memory for a large message stays near twice its size: the joined bytes are decoded to one
`str` and dropped, then `json.loads` builds the message (pydantic's JSON parser keeps an extra
full-size scratch copy of long escaped strings, so it is used for small messages only). The
text values inside the parsed message are the strings the rest of the path keeps: nothing
downstream copies them again.

A line longer than `max_line_bytes` is not buffered: the framer keeps only its first and last
bytes (enough to find the JSON-RPC id) and reports an `OversizedLine`.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

_EDGE_BYTES = 512
"""How much of an oversized line's head and tail is kept to identify the message."""
_SMALL_MESSAGE_BYTES = 64 * 1024
"""Below this, pydantic parses the JSON directly (faster); above it, `json.loads` (leaner)."""

_ID = rb'(-?\d+|"(?:[^"\\]|\\.)*")'
_HEAD_ID = re.compile(rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + _ID)
_TAIL_ID = re.compile(rb'"id"\s*:\s*' + _ID + rb"\s*\}\s*\Z")


@dataclass(frozen=True, slots=True)
class OversizedLine:
    """A line that exceeded the limit: its size, and its first and last bytes."""

    size: int
    head: bytes
    tail: bytes

    def request_id(self) -> int | str | None:
        """The JSON-RPC id of the message, when it sits first or last in the object."""
        match = _HEAD_ID.match(self.head) or _TAIL_ID.search(self.tail)
        if match is None:
            return None
        raw = json.loads(match.group(1))
        return raw if isinstance(raw, int | str) else None


@dataclass(slots=True)
class _Overflow:
    size: int
    head: bytes
    tail: bytes


class LineFramer:
    """Splits a byte stream into lines (without the newline). Feed chunks, then pop lines."""

    __slots__ = ("_max", "_overflow", "_parts", "_ready", "_size")

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._overflow: _Overflow | None = None
        self._ready: deque[bytes | OversizedLine] = deque()

    @property
    def buffered_bytes(self) -> int:
        return self._size

    def feed(self, chunk: bytes) -> None:
        start, end_of_chunk = 0, len(chunk)
        while start < end_of_chunk:
            newline = chunk.find(b"\n", start)
            end = end_of_chunk if newline == -1 else newline
            if end > start:
                self._take(chunk, start, end)
            if newline == -1:
                return
            self._finish_line()
            start = newline + 1

    def pop(self) -> bytes | OversizedLine | None:
        """The next complete line, or None. The framer keeps no reference to it."""
        return self._ready.popleft() if self._ready else None

    def _take(self, chunk: bytes, start: int, end: int) -> None:
        length = end - start
        if self._overflow is None and self._size + length <= self._max:
            whole = start == 0 and end == len(chunk)
            self._parts.append(chunk if whole else chunk[start:end])
            self._size += length
            return
        if self._overflow is None:
            head = bytearray()
            for part in self._parts:
                head += part[: _EDGE_BYTES - len(head)]
                if len(head) >= _EDGE_BYTES:
                    break
            head += chunk[start : start + max(0, _EDGE_BYTES - len(head))]
            tail = self._parts[-1][-_EDGE_BYTES:] if self._parts else b""
            self._overflow = _Overflow(size=self._size, head=bytes(head), tail=tail)
            self._parts.clear()
            self._size = 0
        overflow = self._overflow
        overflow.size += length
        overflow.tail = (overflow.tail + chunk[max(start, end - _EDGE_BYTES) : end])[-_EDGE_BYTES:]

    def _finish_line(self) -> None:
        if self._overflow is not None:
            o = self._overflow
            self._ready.append(OversizedLine(size=o.size, head=o.head, tail=o.tail))
            self._overflow = None
            return
        if not self._parts:
            return
        line = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts.clear()
        self._size = 0
        self._ready.append(line)


def drain_messages(
    framer: LineFramer,
    claim: Callable[[bytes], bool] | None = None,
    take: Callable[[Any], bool] | None = None,
) -> Iterator[SessionMessage | OversizedLine | ValueError]:
    """Parse every complete line the framer holds; blank lines are skipped, bad ones yield an
    error value.

    A line `claim` accepts is parsed to plain JSON first and offered to `take`; what `take`
    keeps is not yielded (the direct requests of `bridges.mcp.stdio`).

    Each line's bytes are dropped as soon as they are decoded (the framer keeps no reference),
    so a large message never has its bytes, its text and its parsed value alive at once.
    """
    while (line := framer.pop()) is not None:
        if isinstance(line, OversizedLine):
            yield line
            continue
        claimed = claim is not None and claim(line)
        text = line.decode("utf-8", "replace")
        del line
        if len(text) < 16 and not text.strip():
            continue
        if claimed and take is not None:
            message = _parse_offered(text, take)
            del text
            if message is not None:
                yield message
            continue
        message = _parse(text)
        del text  # before yielding: the consumer may hold the message for a long time
        yield message


def _parse_offered(text: str, take: Callable[[Any], bool]) -> SessionMessage | ValueError | None:
    try:
        value = json.loads(text)
    except ValueError as exc:
        return ValueError(f"not a JSON-RPC message ({len(text):,} chars): {exc}")
    if take(value):
        return None
    return _validated(value, len(text))


def _parse(text: str) -> SessionMessage | ValueError:
    try:
        if len(text) < _SMALL_MESSAGE_BYTES:
            message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
        else:
            return _validated(json.loads(text), len(text))
    except ValidationError as exc:
        return _invalid(exc, len(text))
    except ValueError as exc:
        return ValueError(f"not a JSON-RPC message ({len(text):,} chars): {exc}")
    return SessionMessage(message)


def _validated(value: Any, size: int) -> SessionMessage | ValueError:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(value, by_name=False))
    except ValidationError as exc:
        return _invalid(exc, size)


def _invalid(exc: ValidationError, size: int) -> ValueError:
    # The error's message only: pydantic's full text quotes the input, which may hold
    # anything the server printed.
    return ValueError(f"not a JSON-RPC message ({size:,} chars): "
                      f"{exc.errors(include_input=False)[0]['msg']}")
