"""Reading stored objects: line ranges, byte ranges and grep.

The functions here are synchronous and run in worker threads. Each starts from a `LineMark`
the index gave it, so it scans at most `MARK_BYTES` before reaching the requested position.
Objects are valid UTF-8 (checked when written) and lines are separated by `\\n` only.

Each reader comes twice: on a path (the local store opens the file) and `..._in` on an open
`ObjectReader` (any engine that can seek and read its objects, e.g. by ranged GETs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from managed_store.index import LineMark
from managed_store.refs import ManagedRef
from managed_store.search import LineMatcher

_BLOCK = 64 * 1024
GREP_LINE_BYTES = 64 * 1024
# Large read buffers are about the event loop, not throughput: a worker thread that releases
# the GIL for I/O every few microseconds (one 8 KiB refill per ~100 lines) starves the loop
# thread for hundreds of milliseconds, because each release resets the GIL's switch timer.
# One refill per MiB leaves the regular 5 ms switch interval in charge.
READ_BUFFER = 1024 * 1024
# A batch is what one round trip to a search worker carries (a longer line goes alone).
_BATCH_BYTES = 1024 * 1024
_BATCH_LINES = 8192


class ObjectReader(Protocol):
    """What the readers need of a stored object: what a binary file opened for reading has
    (absolute byte positions; `read` and `readline` return `b""` at the end)."""

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def read(self, size: int = -1, /) -> bytes: ...

    def readline(self, size: int = -1, /) -> bytes: ...

    def __iter__(self) -> Iterator[bytes]: ...


@dataclass(frozen=True, slots=True)
class TextSlice:
    """A piece of an object.

    `text` is whole UTF-8 characters: for `read_lines` the lines `first_line..last_line`
    (1-based) each with its `\\n`, exactly as stored; for `read_bytes` the bytes
    `offset_bytes..end_bytes`, which touch lines `first_line..last_line`. An empty slice has
    `last_line == first_line - 1`. `eof` is true when `end_bytes` reached the end of the object;
    otherwise a caller paging through continues at `last_line + 1` or `end_bytes`.
    """

    ref: ManagedRef
    text: str
    first_line: int
    last_line: int
    offset_bytes: int
    end_bytes: int
    eof: bool


@dataclass(frozen=True, slots=True)
class GrepMatch:
    """One matching line (1-based `line`), without its line ending, plus up to `context` lines
    on each side. A line longer than `GREP_LINE_BYTES` is cut there and ends with a marker
    `…[line cut: N bytes]` giving its full length."""

    line: int
    text: str
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GrepResult:
    """Matches in line order; `truncated` is true when more than `max_matches` lines matched."""

    ref: ManagedRef
    matches: tuple[GrepMatch, ...]
    truncated: bool


def read_line_range(
    path: Path, ref: ManagedRef, mark: LineMark, offset: int, limit: int
) -> TextSlice:
    """Lines `offset..offset+limit-1`; `mark` must come from `Index.mark_for_line(offset)`."""
    if offset > ref.lines:
        return _past_the_end(ref, offset)
    with path.open("rb", buffering=READ_BUFFER) as file:
        return line_range_in(file, ref, mark, offset, limit)


def line_range_in(
    file: ObjectReader, ref: ManagedRef, mark: LineMark, offset: int, limit: int
) -> TextSlice:
    """`read_line_range` on an open object. Reads at most from `mark` to the start of line
    `offset + limit` (or the end)."""
    if offset > ref.lines:
        return _past_the_end(ref, offset)
    lines: list[bytes] = []
    start = _skip_newlines(file, mark.byte_offset, offset - 1 - mark.newlines)
    file.seek(start)
    for _ in range(limit):
        line = file.readline()
        if not line:
            break
        lines.append(line)
    data = b"".join(lines)
    end = start + len(data)
    return TextSlice(
        ref,
        data.decode("utf-8"),
        offset,
        offset + len(lines) - 1,
        start,
        end,
        end >= ref.size_bytes,
    )


def _past_the_end(ref: ManagedRef, offset: int) -> TextSlice:
    return TextSlice(ref, "", offset, offset - 1, ref.size_bytes, ref.size_bytes, True)


def read_byte_range(
    path: Path, ref: ManagedRef, mark: LineMark, offset: int, limit: int
) -> TextSlice:
    """Whole characters within bytes `offset..offset+limit`; `mark` must come from
    `Index.mark_for_offset(offset)`. A character cut by either edge is left out, so a `limit`
    under 4 can return nothing even before the end."""
    with path.open("rb") as file:
        return byte_range_in(file, ref, mark, offset, limit)


def byte_range_in(
    file: ObjectReader, ref: ManagedRef, mark: LineMark, offset: int, limit: int
) -> TextSlice:
    """`read_byte_range` on an open object. Reads bytes `offset..offset+limit+3` first, then
    `mark..offset` (to count lines)."""
    base = min(offset, ref.size_bytes)
    file.seek(base)
    # 3 bytes more than the window, to see where a character cut by the start ends.
    data = file.read(limit + 3)
    # A start inside a character moves forward to the next character …
    skip = 0
    while skip < min(3, len(data)) and _is_continuation(data[skip]):
        skip += 1
    start = base + skip
    # … and an end inside one moves back to where that character starts.
    window = data[:limit]
    data = window[skip : _whole_characters_length(window, skip)] if skip < limit else b""
    newlines = mark.newlines + _count_newlines(file, mark.byte_offset, start)
    text = data.decode("utf-8")
    end = start + len(data)
    first_line = newlines + 1
    last_line = first_line + text.count("\n") - (1 if text.endswith("\n") else 0)
    if not text:
        last_line = first_line - 1
    return TextSlice(ref, text, first_line, last_line, start, end, end >= ref.size_bytes)


def grep_lines(
    path: Path, ref: ManagedRef, matcher: LineMatcher, *, max_matches: int, context: int
) -> GrepResult:
    """Stream the object in batches of lines (memory O(batch + longest line)) and collect
    the lines `matcher` flags.

    Stops early once `max_matches` matches have their context and one more match proved the
    result truncated, or when the matcher reports the search cancelled (the result is then
    thrown away). The matcher raises `SearchTimeout` past its deadline.
    """
    with path.open("rb", buffering=READ_BUFFER) as file:
        return grep_in(file, ref, matcher, max_matches=max_matches, context=context)


def grep_in(
    file: ObjectReader, ref: ManagedRef, matcher: LineMatcher, *, max_matches: int,
    context: int,
) -> GrepResult:
    """`grep_lines` on an open object, read from its start."""
    collect = _Collect(context, max_matches)
    number = 0
    for batch in _batches(file):
        # Past the last match wanted, lines are read only for the context of earlier ones.
        flags = bytes(len(batch)) if collect.truncated else matcher.flags(batch, number + 1)
        if flags is None:
            break
        for raw, flag in zip(batch, flags, strict=True):
            number += 1
            if not collect.line(number, raw, flag == 1):
                return collect.result(ref)
    return collect.result(ref)


def _batches(file: ObjectReader) -> Iterator[list[bytes]]:
    """The object's lines without their endings, about `_BATCH_BYTES` at a time."""
    batch: list[bytes] = []
    size = 0
    for raw in file:
        # Editors treat CRLF as one line ending; a regex anchored with `$` should too.
        line = raw.rstrip(b"\n").removesuffix(b"\r")
        batch.append(line)
        size += len(line) + 1
        if size >= _BATCH_BYTES or len(batch) >= _BATCH_LINES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


class _Collect:
    """Matches and their context lines, fed one line at a time."""

    def __init__(self, context: int, max_matches: int) -> None:
        self.context, self.max_matches = context, max_matches
        self.before: deque[str] = deque(maxlen=context)
        self.found: list[_Found] = []
        self.waiting: deque[_Found] = deque()  # matches still collecting their `after` lines
        self.truncated = False

    def line(self, number: int, raw: bytes, matched: bool) -> bool:
        """Take line `number`; False once nothing more is needed."""
        matched = matched and not self.truncated
        if not matched and not self.context:
            return True  # the common case, kept cheap
        if matched and len(self.found) == self.max_matches:
            self.truncated, matched = True, False
            if not self.waiting:
                return False
        shown = _shown(raw, raw.decode("utf-8"))
        for item in self.waiting:
            item.after.append(shown)
        while self.waiting and len(self.waiting[0].after) >= self.context:
            self.waiting.popleft()
        if matched:
            self.found.append(_Found(number, shown, tuple(self.before)))
            if self.context:
                self.waiting.append(self.found[-1])
        elif self.truncated and not self.waiting:
            return False
        self.before.append(shown)
        return True

    def result(self, ref: ManagedRef) -> GrepResult:
        matches = tuple(GrepMatch(f.line, f.text, f.before, tuple(f.after)) for f in self.found)
        return GrepResult(ref, matches, self.truncated)


@dataclass(slots=True)
class _Found:
    line: int
    text: str
    before: tuple[str, ...]
    after: list[str] = field(default_factory=list)


def _shown(raw: bytes, line: str) -> str:
    """`line` (whose UTF-8 is `raw`), cut to `GREP_LINE_BYTES` with a marker if longer."""
    if len(raw) <= GREP_LINE_BYTES:
        return line
    head = raw[:GREP_LINE_BYTES]
    head = head[: _whole_characters_length(head, 0)]
    return f"{head.decode('utf-8')}…[line cut: {len(raw)} bytes]"


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _whole_characters_length(data: bytes, start: int) -> int:
    """Length of the longest prefix of `data` that does not end inside a character."""
    end = len(data)
    lead = end - 1
    while lead >= max(start, end - 4) and _is_continuation(data[lead]):
        lead -= 1
    if lead < max(start, end - 4):
        return end  # no lead byte in reach: nothing to trim (cannot happen for valid UTF-8)
    byte = data[lead]
    width = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
    return end if lead + width <= end else lead


def _skip_newlines(file: ObjectReader, start: int, count: int) -> int:
    """Offset just after the `count`-th `\\n` at or after `start` (or the end of the file)."""
    position = start
    file.seek(start)
    while count > 0:
        block = file.read(_BLOCK)
        if not block:
            break
        found = block.count(b"\n")
        if found < count:
            count -= found
            position += len(block)
            continue
        index = -1
        for _ in range(count):
            index = block.index(b"\n", index + 1)
        return position + index + 1
    return position


def _count_newlines(file: ObjectReader, start: int, stop: int) -> int:
    file.seek(start)
    count = 0
    remaining = stop - start
    while remaining > 0:
        block = file.read(min(_BLOCK, remaining))
        if not block:
            break
        count += block.count(b"\n")
        remaining -= len(block)
    return count
