"""The sparse line index: reads deep inside big objects start near the target, not at 0."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path

import pytest
from store_helpers import editor_lines

from managed_store import ManagedStore
from managed_store.index import MARK_BYTES, Index

pytestmark = pytest.mark.anyio


def _index_mark_for_line(root: Path, ref_id: str, line: int) -> tuple[int, int]:
    # A second, read-only connection beside the store's own is fine in WAL mode.
    index = Index(sqlite3.connect(f"file:{root / 'index.sqlite'}?mode=ro", uri=True))
    try:
        mark = index.mark_for_line(ref_id, line)
        return mark.byte_offset, mark.newlines
    finally:
        index.close()


async def test_200k_lines_read_from_the_middle(store: ManagedStore, root: Path) -> None:
    lines = [f"line {n:06d} {'x' * (n % 37)}\n" for n in range(1, 200_001)]
    text = "".join(lines)
    ref = await store.put(text)
    assert ref.lines == 200_000

    page = await store.read_lines(ref.id, offset=123_457, limit=3)
    assert page.text == "".join(lines[123_456:123_459])
    assert (page.first_line, page.last_line) == (123_457, 123_459)
    assert page.offset_bytes == len("".join(lines[:123_456]).encode())

    last = await store.read_lines(ref.id, offset=200_000, limit=10)
    assert (last.text, last.eof) == (lines[-1], True)

    # The index hands the reader a starting point less than one mark spacing before the line.
    mark_offset, mark_newlines = await asyncio.to_thread(
        _index_mark_for_line, root, ref.id, 123_457
    )
    assert 0 < page.offset_bytes - mark_offset <= MARK_BYTES
    assert mark_newlines == text.encode()[:mark_offset].count(b"\n")

    middle = await store.read_bytes(ref.id, offset=page.offset_bytes, limit=len(lines[123_456]))
    assert (middle.text, middle.first_line, middle.last_line) == (lines[123_456], 123_457, 123_457)


async def test_positions_around_every_mark_match_brute_force(store: ManagedStore) -> None:
    rng = random.Random(7)
    pieces = ["a", "é", "€", "😀", "\n", "\n\n", "word ", "\r\n"]
    text = "".join(rng.choice(pieces) for _ in range(120_000))
    data = text.encode()
    assert len(data) > 4 * MARK_BYTES
    ref = await store.put(text)
    lines = editor_lines(data)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    for mark in range(MARK_BYTES, len(data), MARK_BYTES):
        for offset in range(mark - 4, mark + 5):
            got = await store.read_bytes(ref.id, offset, 16)
            start = got.offset_bytes
            assert offset <= start <= offset + 3
            assert data[start] & 0xC0 != 0x80
            assert got.text.encode() == data[start : got.end_bytes]
            assert got.first_line == data[:start].count(b"\n") + 1

        # The line that contains the mark, and its neighbours, by line number.
        line_no = data[:mark].count(b"\n") + 1
        for number in range(max(1, line_no - 2), min(len(lines), line_no + 2) + 1):
            got_line = await store.read_lines(ref.id, number, 1)
            assert got_line.text.encode() == lines[number - 1]
            assert got_line.offset_bytes == starts[number - 1]


async def test_one_huge_line_is_read_by_byte_ranges(store: ManagedStore) -> None:
    text = "€" * (3 * MARK_BYTES) + "\nend"
    ref = await store.put(text)
    assert ref.lines == 2
    got = await store.read_bytes(ref.id, offset=2 * MARK_BYTES + 1, limit=7)
    assert got.text == "€€"
    assert got.first_line == got.last_line == 1
    tail = await store.read_lines(ref.id, offset=2)
    assert (tail.text, tail.offset_bytes) == ("end", 9 * MARK_BYTES + 1)
