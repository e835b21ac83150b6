"""Reading inside one line by characters: the way through minified JSON, HTML, or any text
whose lines are longer than a model may see at once.

`read_line_chars` runs in a worker thread like the readers of `reading`. It starts from the
`LineMark` the index gave for the line, skips to the line's first byte, then decodes forward
in blocks until it has skipped `start` characters and taken `length` more, or the line ends.
Cost is O(start + length) characters of that one line; memory O(length + one block).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path

from managed_store.index import LineMark
from managed_store.reading import READ_BUFFER, ObjectReader, _skip_newlines
from managed_store.refs import ManagedRef

_BLOCK = 256 * 1024


@dataclass(frozen=True, slots=True)
class LineChars:
    """Characters `start..start+len(text)-1` (0-based) of line `line` (1-based), without its
    `\\n`. `end_of_line` is true when `text` reaches the end of that line (a reader continues
    with the next line); otherwise it continues at `start + len(text)` in the same line.
    `line` past the last line, or `start` past the end of the line, gives empty text with
    `end_of_line` true."""

    ref: ManagedRef
    line: int
    start: int
    text: str
    end_of_line: bool

    @property
    def next_start(self) -> int:
        return self.start + len(self.text)


def read_line_chars(
    path: Path, ref: ManagedRef, mark: LineMark, line: int, start: int, length: int
) -> LineChars:
    """`mark` must come from `Index.mark_for_line(line)`."""
    if line > ref.lines:
        return LineChars(ref, line, start, "", True)
    with path.open("rb", buffering=READ_BUFFER) as file:
        return line_chars_in(file, ref, mark, line, start, length)


def line_chars_in(
    file: ObjectReader, ref: ManagedRef, mark: LineMark, line: int, start: int, length: int
) -> LineChars:
    """`read_line_chars` on an open object."""
    if line > ref.lines:
        return LineChars(ref, line, start, "", True)
    decoder = codecs.getincrementaldecoder("utf-8")()
    skipped = 0
    taken: list[str] = []
    count = 0
    file.seek(_skip_newlines(file, mark.byte_offset, line - 1 - mark.newlines))
    while True:
        block = file.read(_BLOCK)
        newline = block.find(b"\n")
        last = not block or newline != -1
        chars = decoder.decode(block if newline == -1 else block[:newline], final=last)
        if skipped < start:
            drop = min(start - skipped, len(chars))
            skipped += drop
            chars = chars[drop:]
        room = length - count
        if len(chars) > room:
            taken.append(chars[:room])
            return LineChars(ref, line, start, "".join(taken), False)
        taken.append(chars)
        count += len(chars)
        if last:
            return LineChars(ref, line, start, "".join(taken), True)
        if count == length:  # full: is the line over right here?
            peek = file.read(1)
            return LineChars(ref, line, start, "".join(taken), peek in (b"", b"\n"))
