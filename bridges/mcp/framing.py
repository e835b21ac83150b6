"""Newline-delimited JSON-RPC framing for stdio, in linear time and with few copies. Imports
`bridges.mcp.piecewise_json` only; exports `LineFramer`, `OversizedLine`, `LargeLine`,
`drain_messages`, `offer_large`, `InvalidAnswer`, `PARSE_OFF_LOOP_AT`, and `LineReader` with
`read_chunk` and `take_lines` (lines handled as they arrive).

`LineFramer` scans each byte once (the SDK's stdio reader re-splits its buffer for every chunk,
quadratic in the line length): chunks of an unfinished line are kept in a list and joined
once, when the newline arrives. A buffered message stays near twice its size: the joined bytes
are decoded to one `str` and dropped, then `json.loads` builds the message (pydantic's JSON
parser, which keeps an extra full-size scratch copy of long escaped strings, for small
messages only); the text values inside it are the strings the rest of the path keeps, nothing
downstream copies them again. A line longer than `max_line_bytes` is not buffered: only its
first and last bytes are kept (enough to find the JSON-RPC id), as an `OversizedLine`. Large
lines are parsed as they arrive, or off the event loop: `LineFramer`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, SupportsIndex

import mcp_types as types
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from bridges.mcp.piecewise_json import loads_in_pieces

_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]

_EDGE_BYTES = 512
"""How much of an oversized line's head and tail is kept to identify the message."""
PARSE_OFF_LOOP_AT = 256 * 1024
"""A line this long or longer is parsed off the event loop (`LargeLine`)."""
_SMALL_MESSAGE_BYTES = 64 * 1024
"""Below this, pydantic parses the JSON directly (faster); above it, `json.loads` (leaner)."""

_LONG_STRING = 64 * 1024
"""In a streamed line, a string value at least this long (raw) is decoded on its own and kept
out of the JSON that is parsed at the end."""
_DECODE_SLICE = 1024 * 1024
"""A long string's raw bytes are decoded once this many are waiting, or a 32nd of its text so
far when that is more (`_StreamedLine._decode_ready`)."""
_SAFE_CUT_WINDOW = 4096
"""How far back from a slice's end `_safe_cut` looks for a place to cut; none found (escapes
everywhere), the bytes wait for the next slice."""
_SKELETON_RUN = re.compile(rb'[^"]*(?:"[^"\\]*(?:\\.[^"\\]*)*"[^"]*)*', re.DOTALL)
"""Bytes outside strings, with the strings that end in the same piece, in one C call."""
_STRING_BODY = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
"""A string's bytes up to its closing quote, or to a backslash that ends the piece."""
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


@dataclass(frozen=True, slots=True)
class LargeLine:
    """A complete line of at least `PARSE_OFF_LOOP_AT` bytes, not parsed yet: parsing it is CPU
    work that grows with its size, so `parse` is for a worker thread (it parses in bounded
    steps, `bridges.mcp.piecewise_json`, so the event loop keeps running meanwhile).
    `skeleton`: its bytes outside long strings, where its JSON-RPC id is."""

    size: int
    skeleton: bytes
    decode: Callable[[], Any]
    """The plain JSON value, or the `ValueError` that stopped it."""

    def edges(self) -> OversizedLine:
        """Its size and the first and last bytes of its skeleton (`request_id()`)."""
        return OversizedLine(self.size, self.skeleton[:_EDGE_BYTES], self.skeleton[-_EDGE_BYTES:])

    def parse(self, validate: bool) -> tuple[Any, SessionMessage | ValueError | None]:
        """(value, None), or with `validate` (None, the message): either way (None, error)
        when it is not JSON-RPC."""
        value = self.decode()
        if isinstance(value, ValueError):
            request_id = self.edges().request_id() if "nested too deeply" in str(value) else None
            # Too deep for the parser, as for a whole line (`_nested_too_deep`): when the id
            # is found, its request fails at once instead of at its timeout.
            return None, value if request_id is None else InvalidAnswer(str(value), request_id)
        if not validate:
            return value, None
        return None, _validated(value, self.size)


class _Edges:
    """A line's size so far and its first and last `_EDGE_BYTES` (where its JSON-RPC id is),
    kept for a line that is not buffered."""

    __slots__ = ("head", "size", "tail")

    def __init__(self) -> None:
        self.size = 0
        self.head = b""
        self.tail = b""

    def add(self, data: bytes, start: int = 0, end: int | None = None) -> None:
        """Count `data[start:end]` (slicing only its edges)."""
        end = len(data) if end is None else end
        self.size += end - start
        if len(self.head) < _EDGE_BYTES:
            self.head += data[start : min(end, start + _EDGE_BYTES - len(self.head))]
        self.tail = (self.tail + data[max(start, end - _EDGE_BYTES) : end])[-_EDGE_BYTES:]

    def oversized(self) -> OversizedLine:
        return OversizedLine(size=self.size, head=self.head, tail=self.tail)


class LineFramer:
    """Splits a byte stream into lines (without the newline). Feed chunks, then pop lines.

    With `stream_at` (the upstream side), a line that grows past it is parsed as it arrives
    instead (`LargeLine`): its long string values (a tool's text result) are decoded slice by
    slice into the one `str` that is kept, and only the rest of the JSON is parsed at the end,
    so a large result is held about once instead of twice (its bytes, then its text). A
    string's end is found with `bytes.count`/`find` (C) and the regex only where quotes are
    many, about as fast as `json.loads` of the whole line (`bench/RESULTS.md`). Lines up to
    `stream_at` are parsed whole (the small ones by pydantic, which is faster for them).

    A line of `PARSE_OFF_LOOP_AT` (256 KiB) or more is a `LargeLine`: its JSON (for a streamed
    line, the part outside long strings) is parsed by `bridges.mcp.piecewise_json` in bounded
    steps, which the stdio transport runs in a worker thread (`drain_messages(defer_large=True)`),
    so a huge `tools/list` answer does not stop the event loop (`/v1/health`, other servers'
    start-up timers) while it is parsed.
    """

    __slots__ = ("_max", "_overflow", "_parts", "_ready", "_size", "_stream", "_stream_at")

    def __init__(self, max_line_bytes: int, stream_at: int | None = None) -> None:
        self._max = max_line_bytes
        self._stream_at = stream_at
        self._parts: list[bytes] = []
        self._size = 0
        self._overflow: _Edges | None = None
        self._stream: _StreamedLine | None = None
        self._ready: deque[bytes | OversizedLine | LargeLine] = deque()

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

    def pop(self) -> bytes | OversizedLine | LargeLine | None:
        """The next complete line, or None. The framer keeps no reference to it."""
        return self._ready.popleft() if self._ready else None

    def _take(self, chunk: bytes, start: int, end: int) -> None:
        length = end - start
        if self._overflow is None and self._size + length <= self._max:
            whole = start == 0 and end == len(chunk)
            part = chunk if whole else chunk[start:end]
            self._size += length
            if self._stream is not None:
                self._stream.feed(part)
                return
            self._parts.append(part)
            if self._stream_at is not None and self._size > self._stream_at:
                self._stream = _StreamedLine()
                for buffered in self._parts:
                    self._stream.feed(buffered)
                self._parts.clear()
            return
        if self._overflow is None:
            if self._stream is not None:  # its edges were kept as it was fed
                self._overflow, self._stream = self._stream.edges, None
            else:
                self._overflow = _Edges()
                for buffered in self._parts:
                    self._overflow.add(buffered)
                self._parts.clear()
            self._size = 0
        self._overflow.add(chunk, start, end)

    def _finish_line(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            self._ready.append(stream.finish())
            self._size = 0
            return
        if self._overflow is not None:
            self._ready.append(self._overflow.oversized())
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
    *,
    defer_large: bool = False,
) -> Iterator[SessionMessage | OversizedLine | LargeLine | ValueError]:
    """Parse every complete line the framer holds; blank lines are skipped, bad ones yield an
    error value. With `defer_large`, a line of `PARSE_OFF_LOOP_AT` bytes or more is yielded
    unparsed (a `LargeLine`, for the caller to parse off the event loop, in order, and to
    finish with `offer_large`).

    A line `claim` accepts is parsed to plain JSON first and offered to `take`; what `take`
    keeps is not yielded (the direct requests of `bridges.mcp.stdio`).

    Each line's bytes are dropped as soon as they are decoded (the framer keeps no reference),
    so a large message never has its bytes, its text and its parsed value alive at once.
    """
    while (line := framer.pop()) is not None:
        if isinstance(line, OversizedLine):
            yield line
            continue
        if not isinstance(line, LargeLine) and len(line) >= PARSE_OFF_LOOP_AT:
            line = LargeLine(len(line), line, functools.partial(_decode_whole, line))
        if isinstance(line, LargeLine):
            if defer_large:
                yield line
                continue
            claimed = claim is not None and claim(line.skeleton)
            value, parsed = line.parse(validate=not claimed)
            settled = parsed if value is None else offer_large(line, value, take)
            if settled is not None:
                yield settled
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


def offer_large(
    line: LargeLine, value: Any, take: Callable[[Any], bool] | None
) -> SessionMessage | ValueError | None:
    """A claimed large line's value offered to `take` (None: taken), else validated."""
    if take is not None and take(value):
        return None
    return _validated(value, line.size)


def _decode_whole(line: bytes) -> Any:
    """A large line's plain JSON value (or the error), parsed in bounded steps."""
    text = line.decode("utf-8", "replace")
    try:
        return loads_in_pieces(text)
    except ValueError as exc:
        return ValueError(f"not a JSON-RPC message ({len(text):,} chars): {exc}")


def _parse_offered(text: str, take: Callable[[Any], bool]) -> SessionMessage | ValueError | None:
    try:
        value = json.loads(text)
    except ValueError as exc:
        return ValueError(f"not a JSON-RPC message ({len(text):,} chars): {exc}")
    except RecursionError:
        return _nested_too_deep(text)
    if take(value):
        return None
    return _validated(value, len(text))


class InvalidAnswer(ValueError):
    """A line that is JSON but not a JSON-RPC message, and that names a request (`request_id`):
    the reader fails that request at once instead of leaving it to its timeout."""

    def __init__(self, message: str, request_id: int | str) -> None:
        super().__init__(message)
        self.request_id = request_id


def _parse(text: str) -> SessionMessage | ValueError:
    try:
        if len(text) < _SMALL_MESSAGE_BYTES:
            message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
        else:
            return _validated(json.loads(text), len(text))
    except ValidationError as exc:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        except RecursionError:
            return _nested_too_deep(text)
        return _invalid(exc, len(text), value)
    except ValueError as exc:
        return ValueError(f"not a JSON-RPC message ({len(text):,} chars): {exc}")
    except RecursionError:
        return _nested_too_deep(text)
    return SessionMessage(message)


def _nested_too_deep(text: str) -> ValueError:
    """A line nested deeper than `json.loads` can follow: an error value (an `InvalidAnswer`
    when its id sits first or last), never a `RecursionError` that would end the reader."""
    message = f"not a JSON-RPC message ({len(text):,} chars): nested too deeply"
    edges = OversizedLine(len(text), text[:_EDGE_CHARS].encode("utf-8", "replace"),
                          text[-_EDGE_CHARS:].encode("utf-8", "replace"))
    request_id = edges.request_id()
    return ValueError(message) if request_id is None else InvalidAnswer(message, request_id)


_EDGE_CHARS = 256


def _validated(value: Any, size: int) -> SessionMessage | ValueError:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(value, by_name=False))
    except ValidationError as exc:
        return _invalid(exc, size, value)


def _invalid(exc: ValidationError, size: int, value: Any = None) -> ValueError:
    # The error's message only: pydantic's full text quotes the input, which may hold
    # anything the server printed.
    message = (f"not a JSON-RPC message ({size:,} chars): "
               f"{exc.errors(include_input=False)[0]['msg']}")
    if isinstance(value, dict) and "method" not in value:
        request_id = value.get("id")
        if isinstance(request_id, int | str) and not isinstance(request_id, bool):
            return InvalidAnswer(message, request_id)  # an answer, but not a valid one
    return ValueError(message)


class _StreamedLine:
    """One JSON text fed in pieces: the bytes outside long strings are kept (`skeleton`); a
    string still open at the end of a piece is collected on its own, decoded in slices as it
    grows, and if it reaches `_LONG_STRING` bytes it is replaced by a placeholder that `finish`
    swaps back after parsing the skeleton. A string that ends in the piece where it starts goes
    to the skeleton whole (pipe reads are at most 64 KiB, so a long text always spans pieces).
    Invalid UTF-8 is replaced, as `drain_messages` does for a whole line; a long string that is
    not valid JSON (a bad escape) makes the line an error value, and the rest is only counted."""

    __slots__ = ("_error", "_escaping", "_in_string", "_longs", "_marker", "_skeleton",
                 "_string", "_text", "edges")

    def __init__(self) -> None:
        self.edges = _Edges()
        self._skeleton = bytearray()
        self._in_string = False
        self._escaping = False  # the current string's last byte so far is an escape's backslash
        self._string = bytearray()  # the current string's raw bytes not decoded yet
        self._text: str | None = None  # its decoded slices so far, once it is long
        self._longs: list[str] = []
        self._marker = f"\x00sidecar-long-string:{secrets.token_hex(8)}:"
        self._error: ValueError | None = None

    def feed(self, data: bytes) -> None:
        self.edges.add(data)
        if self._error is not None:
            return
        try:
            self._scan(data)
        except ValueError as exc:  # from decoding a slice of a long string
            self._error = exc
            self._string, self._text, self._longs = bytearray(), None, []

    def _scan(self, data: bytes) -> None:
        position, size = 0, len(data)
        while position < size:
            if not self._in_string:
                run = _SKELETON_RUN.match(data, position)
                end = run.end() if run is not None else position
                self._skeleton += data[position:end]
                if end == size:
                    return
                self._in_string, position = True, end + 1  # data[end] opens a string
                continue
            if self._escaping:  # the previous piece ended with this escape's backslash
                self._string += data[position : position + 1]
                self._escaping, position = False, position + 1
                continue
            end = _string_end(data, position)
            if end == -1:  # the string goes on in the next piece
                self._string += memoryview(data)[position:]
                self._escaping = _ends_in_escape(data, position)
                self._decode_ready()
                return
            self._string += memoryview(data)[position:end]
            self._close_string()
            position = end + 1

    def _decode_ready(self) -> None:
        # Slices grow with the text (a 32nd of it): each append may move the page table of
        # the whole text (`mremap`), so 1 MiB slices made a 1 GB text quadratic (1,000 moves,
        # 3.2 s); this way it is ~140.
        done = 0 if self._text is None else len(self._text)
        if len(self._string) >= max(_DECODE_SLICE, done >> 5) and (
            cut := _safe_cut(self._string)
        ):
            self._append(_decode_prefix(self._string, cut))

    def _append(self, piece: str) -> None:
        """Add `piece` to the long string's text, in place: with the text's one reference in a
        local, CPython resizes it (realloc, no copy of the characters). That is its
        specialization of `+=`, applied to code warmed up by calls or loops (this runs once
        per slice; under a profiler such as cProfile it is not applied at all)."""
        text, self._text = self._text, None
        if text is None:
            text = piece
        else:
            text += piece
        del piece
        self._text = text

    def _close_string(self) -> None:
        self._in_string = False
        if self._text is None and len(self._string) < _LONG_STRING:
            self._skeleton += b'"' + self._string + b'"'
            self._string.clear()
            return
        self._append(_decode_prefix(self._string, len(self._string)))
        text, self._text = self._text, None
        assert text is not None  # set by `_append`
        self._longs.append(text)
        placeholder = json.dumps(f"{self._marker}{len(self._longs) - 1}")
        self._skeleton += placeholder.encode()

    def finish(self) -> LargeLine:
        """The line, to be parsed (its skeleton, with the long strings put back) off the loop."""
        skeleton = bytes(self._skeleton)
        size = self.edges.size
        problem = self._error or (
            ValueError("the line ends inside a string") if self._in_string else None)
        longs, self._longs = self._longs, []
        return LargeLine(size, skeleton, functools.partial(
            _decode_skeleton, skeleton, self._marker, longs, size, problem))


def _decode_skeleton(
    skeleton: bytes, marker: str, longs: list[str], size: int, problem: ValueError | None
) -> Any:
    try:
        if problem is not None:
            raise problem
        return _restore(loads_in_pieces(skeleton.decode("utf-8", "replace")), marker, longs)
    except ValueError as exc:
        return ValueError(f"not a JSON-RPC message ({size:,} bytes): {exc}")


_FOUND_QUOTES = 16
"""In a piece where a string may end, `_string_end` checks this many quotes one by one
(`bytes.find`, then the backslashes before each) before it hands the rest of the piece to the
string regex: `find` skips text in C, where the regex takes a step per escape (such as every
line's `\\n`), but among many escaped quotes (JSON inside a text) a regex step beats a loop
turn."""


def _string_end(data: bytes, start: int) -> int:
    """The index in `data` of the quote that closes the string whose bytes (not inside an
    escape) begin at `start`, or -1 if the string goes on after `data`."""
    quotes = data.count(b'"', start)
    if quotes == 0 or (quotes == data.count(b'\\"', start)
                       and data.find(b'\\\\"', start) == -1):
        return -1  # no quote, or each one escaped by a lone backslash (JSON inside a text)
    position = start
    for _ in range(_FOUND_QUOTES):
        quote = data.find(b'"', position)
        if quote == -1:
            return -1
        before = quote - 1
        while before >= start and data[before] == 0x5C:
            before -= 1
        if (quote - before) % 2:  # an even run of backslashes before it: it closes the string
            return quote
        position = quote + 1  # an escaped quote; after it, no escape is open
    body = _STRING_BODY.match(data, position)
    end = body.end() if body is not None else position
    return end if end < len(data) and data[end] == 0x22 else -1


def _ends_in_escape(data: bytes, start: int) -> bool:
    """Whether `data`, inside a string from `start` on, ends with an escape's backslash (an odd
    run of backslashes)."""
    last = len(data) - 1
    while last >= start and data[last] == 0x5C:
        last -= 1
    return (len(data) - 1 - last) % 2 == 1


def _safe_cut(raw: bytearray) -> int:
    """Where `raw` (a string's bytes) can be split so that both sides decode on their own: at
    the start of a UTF-8 character, with no backslash in the 6 bytes before it (so not inside
    an escape, nor between the two escapes of a surrogate pair); 0 if none near the end."""
    end = len(raw)
    for cut in range(end - 1, max(end - _SAFE_CUT_WINDOW, 6), -1):
        if raw[cut] & 0xC0 != 0x80 and raw.find(b"\\", cut - 6, cut) == -1:
            return cut
    return 0


def _decode_prefix(raw: bytearray, cut: int) -> str:
    """Decode (and remove) `raw[:cut]`, a string's bytes cut where `_safe_cut` allows. Its one
    transient copy is the UTF-8 text: a closing quote is put into `raw` itself for
    `scanstring`, and the bytes are read through a view."""
    raw.insert(cut, 0x22)
    with memoryview(raw) as view:
        text = str(view[: cut + 1], "utf-8", "replace")
    del raw[: cut + 1]
    value, _ = _scanstring(text, 0)
    return value


def _restore(value: Any, marker: str, longs: list[str]) -> Any:
    """`value` with each placeholder string (a value or a key) replaced by its long string."""
    def swap(item: Any) -> Any:
        if isinstance(item, str):
            return longs[int(item[len(marker):])] if item.startswith(marker) else item
        if isinstance(item, dict):
            return {swap(key): swap(entry) for key, entry in item.items()}
        if isinstance(item, list):
            return [swap(entry) for entry in item]
        return item

    return swap(value) if longs else value


class LineReader(asyncio.StreamReader):
    """A stream whose bytes are first offered, as they arrive (from the transport's
    callback), to `take`, while its reader waits with nothing held (`read_chunk`): `take(data)`
    handles whole lines from the start of `data` and says how many bytes it used; the rest goes
    through the stream as before, so lines are still handled in order. A line handled there
    costs no buffer, waiter, task step nor framer (~10 µs each in the daemon, 2026-12-06)."""

    def __init__(self, take: Callable[[bytes], int], *, limit: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self._take = take
        self._idle = False  # `read_chunk` waits, and neither it nor the stream holds a byte
        self._drained = True  # the last read took all the stream held (it was short)

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        if self._idle and isinstance(data, bytes):  # (transports hand bytes)
            taken = self._take(data)
            if taken == len(data):
                return
            data = data[taken:]
        self._idle = False  # bytes are buffered now: the loop reads them in order
        super().feed_data(data)

    async def read_held(self, n: int, *, held: bool) -> bytes:
        """`read(n)` for a loop that `held` part of a line back: while it waits holding
        nothing, and the stream holds nothing either, lines go to `take` as they arrive."""
        self._idle = self._drained and not held
        try:
            data = await self.read(n)
        finally:
            self._idle = False
        self._drained = len(data) < n
        return data


async def read_chunk(reader: asyncio.StreamReader, n: int, *, held: bool) -> bytes:
    """`reader.read(n)`, through `LineReader.read_held` when it is one (`held`: the caller
    holds part of a line)."""
    if isinstance(reader, LineReader):
        return await reader.read_held(n, held=held)
    return await reader.read(n)


def take_lines(data: bytes, take: Callable[[bytes], bool], limit: int) -> int:
    """How many bytes of `data`, whole lines from its start, `take` took (it is offered each
    non-blank line shorter than `limit` until it refuses one)."""
    start = 0
    while (end := data.find(b"\n", start)) >= 0:
        if end - start >= limit or not take(data[start:end]):
            break
        start = end + 1
    return start
