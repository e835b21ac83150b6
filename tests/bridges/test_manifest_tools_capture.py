"""Output capture and progress lines, against a real managed store."""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import struct
import termios
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bridges.manifest_tools.capture import OutputCapture, spooled_preview, tail_start
from bridges.manifest_tools.progress import LineProgress
from managed_store import ManagedRef, ManagedStore, RetentionError

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ManagedStore]:
    async with await ManagedStore.open(tmp_path / "store") as opened:
        yield opened


def capture(store: ManagedStore, memory_cap: int = 16, hard_cap: int = 10**9,
            encoding: str = "utf-8") -> OutputCapture:
    return OutputCapture(store, namespace="t", memory_cap=memory_cap, hard_cap=hard_cap,
                         encoding=encoding)


async def feed_bytewise(target: OutputCapture, data: bytes) -> None:
    for i in range(len(data)):
        await target.feed(data[i : i + 1])


async def test_characters_split_across_chunks_stay_whole_in_memory_and_in_the_store(store):
    text = "añ€😀 " * 40
    async with capture(store, memory_cap=1 << 20) as small:
        await feed_bytewise(small, text.encode())
        kept = await small.finish()
    assert kept.text == text and kept.ref is None and not kept.replaced
    async with capture(store, memory_cap=16) as spooled:
        await feed_bytewise(spooled, text.encode())
        retained = await spooled.finish()
    assert retained.text is None and retained.ref is not None
    assert retained.kept_bytes == len(text.encode()) == retained.ref.size_bytes
    read = await store.read_bytes(retained.ref.id, offset=0, limit=1 << 20)
    assert read.text == text


async def test_invalid_bytes_are_replaced_after_spooling_began_and_flagged(store):
    async with capture(store, memory_cap=16) as target:
        await target.feed(b"valid text that spills over\n")
        await target.feed(b"then \xff\xfe junk \xe2\x82")  # also ends inside a character
        kept = await target.finish()
    assert kept.replaced and kept.ref is not None
    read = await store.read_bytes(kept.ref.id, offset=0, limit=1000)
    assert read.text == "valid text that spills over\nthen \ufffd\ufffd junk \ufffd"


async def test_ascii_after_an_open_character_is_not_passed_through(store):
    # b"\xe2\x82" opens a three-byte character; ASCII next means the character never ends.
    async with capture(store, memory_cap=16) as target:
        await target.feed(b"spilled over the memory cap\n\xe2\x82")
        await target.feed(b"abc\n")
        kept = await target.finish()
    assert kept.replaced and kept.ref is not None
    read = await store.read_bytes(kept.ref.id, offset=0, limit=1000)
    assert read.text == "spilled over the memory cap\n\ufffdabc\n"


async def test_spooled_mixed_chunks_keep_text_head_and_tail_exact(store):
    # ASCII chunks pass through as bytes, others are decoded: the store, the head and the
    # tail all see one text, even with a character split between a chunk of each kind.
    parts = [b"a" * 5000, "é€".encode() * 2000, b"b" * 3000, "😀".encode()[:2],
             "😀".encode()[2:] + b"c" * 9000, b"\n" * 10]
    text = b"".join(parts).decode()
    async with capture(store, memory_cap=16) as target:
        for part in parts:
            await target.feed(part)
        kept = await target.finish()
    assert not kept.replaced and kept.ref is not None
    assert kept.ref.size_bytes == len(text.encode()) == kept.kept_bytes
    read = await store.read_bytes(kept.ref.id, offset=0, limit=1 << 20)
    assert read.text == text
    assert text.startswith(kept.head) and text.endswith(kept.tail)
    assert len(kept.head) == len(kept.tail) == 8 * 1024 + 1


async def test_a_spooled_latin1_stream_is_stored_as_utf8(store):
    data = "café \xff\n".encode("latin-1") * 1000
    async with capture(store, memory_cap=16, encoding="latin-1") as target:
        await target.feed(data)
        kept = await target.finish()
    assert kept.ref is not None and not kept.replaced
    read = await store.read_bytes(kept.ref.id, offset=0, limit=1 << 20)
    assert read.text == data.decode("latin-1")


async def test_declared_charsets_decode(store):
    async with capture(store, memory_cap=1 << 20, encoding="latin-1") as target:
        await target.feed("café".encode("latin-1"))
        kept = await target.finish()
    assert kept.text == "café" and not kept.replaced


async def test_the_hard_cap_counts_every_dropped_byte(store):
    async with capture(store, memory_cap=1 << 20, hard_cap=10) as target:
        await target.feed(b"0123456")
        await target.feed(b"789abc")
        await target.feed(b"defg")
        kept = await target.finish()
    assert kept.text == "0123456789" and kept.dropped_bytes == 7 and kept.kept_bytes == 10


async def test_leaving_without_finish_leaves_nothing_in_the_store(store):
    with pytest.raises(RuntimeError):
        async with capture(store, memory_cap=16) as target:
            await target.feed(b"x" * 100)
            raise RuntimeError("the producer failed")
    assert (await store.stats()).count == 0


async def test_batches_written_while_the_next_is_read_arrive_whole_and_in_order(store):
    lines = [b"%06d line of output\n" % n for n in range(300_000)]  # ~6 MB: many batches
    async with capture(store, memory_cap=1024) as target:
        for start in range(0, len(lines), 5_000):
            await target.feed(b"".join(lines[start : start + 5_000]))
        kept = await target.finish()
    assert kept.ref is not None and kept.ref.lines == len(lines)
    page = await store.read_lines(kept.ref.id, offset=123_457, limit=2)
    assert page.text.encode() == lines[123_456] + lines[123_457]
    assert kept.tail.encode().endswith(lines[-1])


async def test_a_batch_failing_in_flight_raises_and_leaves_nothing(tmp_path: Path):
    root = tmp_path / "small"
    async with await ManagedStore.open(root, quota_bytes=8 * 1024 * 1024) as small:
        with pytest.raises(RetentionError, match="quota"):
            async with capture(small, memory_cap=1024) as target:
                for _ in range(40):  # 10 MiB in 256 KiB chunks, into an 8 MiB quota
                    await target.feed((b"z" * 1023 + b"\n") * 256)
                await target.finish()
        assert (await small.stats()).count == 0
    assert list((root / "objects").iterdir()) == []


@contextmanager
def producing(data: bytes) -> Iterator[int]:
    """The read end of a pipe that a thread fills with `data`, then closes."""
    read_fd, write_fd = os.pipe()

    def write() -> None:
        with open(write_fd, "wb") as pipe:
            pipe.write(data)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        yield read_fd
    finally:
        writer.join()
        os.close(read_fd)


SPILLED = b"spilled over the memory cap\n" * 400  # the preview's head is complete after it


async def test_feed_from_reads_the_rest_in_the_spool_thread_as_feed_would(store):
    rest = "".join(f"line {n} caf\u00e9 \u20ac\n" for n in range(200_000)).encode()
    async with capture(store, memory_cap=1024) as target:
        assert not target.takes_fd  # nothing spooled yet
        await target.feed(SPILLED)
        assert target.takes_fd
        with producing(rest) as read_fd:
            assert await target.feed_from(read_fd)
        threaded = await target.finish()
    async with capture(store, memory_cap=1024) as target:
        await target.feed(SPILLED)
        for start in range(0, len(rest), 65536):
            await target.feed(rest[start : start + 65536])
        fed = await target.finish()

    whole = (SPILLED + rest).decode()
    assert threaded.ref is not None and fed.ref is not None
    assert threaded.kept_bytes == len(SPILLED + rest) == threaded.ref.size_bytes
    assert (threaded.head, threaded.tail) == (fed.head, fed.tail)
    assert threaded.tail == whole[-len(threaded.tail):] and len(threaded.tail) == 8193
    assert threaded.ref.lines == fed.ref.lines == 400 + 200_000
    read = await store.read_bytes(threaded.ref.id, offset=0, limit=len(whole.encode()))
    assert read.text == whole
    previews = [c.preview("stdout").replace(c.ref.id, "<ref>") for c in (threaded, fed) if c.ref]
    assert previews[0] == previews[1]


async def test_feed_from_hands_back_at_bytes_that_are_not_utf8(store):
    rest = b"ok line\n" * 50_000 + b"bad \xff here\n" + b"after\n" * 1000
    async with capture(store, memory_cap=1024) as target:
        await target.feed(SPILLED)
        with producing(rest) as read_fd:
            while target.takes_fd:
                if await target.feed_from(read_fd):
                    break
            while data := os.read(read_fd, 65536):  # as the pump does once handed back
                await target.feed(data)
        kept = await target.finish()
    assert not target.takes_fd  # it does not try again on this stream
    assert kept.replaced and kept.ref is not None
    assert kept.kept_bytes == len(SPILLED + rest)
    read = await store.read_bytes(kept.ref.id, offset=0, limit=2 * len(rest))
    assert read.text == (SPILLED + rest).decode("utf-8", "replace")


async def test_feed_from_keeps_the_hard_cap_exactly(store):
    rest = b"0123456789\n" * 100_000
    cap = len(SPILLED) + 250_001
    async with capture(store, memory_cap=1024, hard_cap=cap) as target:
        await target.feed(SPILLED)
        with producing(rest) as read_fd:
            assert await target.feed_from(read_fd)
        kept = await target.finish()
    assert (kept.kept_bytes, kept.dropped_bytes) == (cap, len(SPILLED + rest) - cap)
    assert kept.ref is not None and kept.ref.size_bytes == cap
    assert kept.tail.endswith("0123456789\n0123")  # 250,001 = 22,727 lines + 4 bytes


async def test_a_cancelled_feed_from_leaves_a_capture_that_can_finish(store):
    read_fd, write_fd = os.pipe()  # the write end stays open: the pipe goes quiet, not ended
    try:
        async with capture(store, memory_cap=1024) as target:
            await target.feed(SPILLED)
            os.write(write_fd, b"read before the cancel\n")
            reading = asyncio.create_task(target.feed_from(read_fd))
            for _ in range(500):  # until the thread read it
                if not unread(read_fd):
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # and appended
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            kept = await target.finish()
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert kept.ref is not None
    assert kept.kept_bytes == len(SPILLED) + 23 == kept.ref.size_bytes
    assert kept.tail.endswith("spilled over the memory cap\nread before the cancel\n")


def unread(fd: int) -> int:
    """Bytes waiting in the pipe whose read end is `fd`."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, struct.pack("i", 0)))[0])


def test_the_preview_names_exact_omitted_lines():
    lines = [f"line {i}\n" for i in range(1, 5001)]
    text = "".join(lines)
    ref = ManagedRef("m_" + "a" * 26, len(text), 5000, 0.0, "t")
    preview = spooled_preview("stdout", text[:9000], text[-9000:], ref)
    marker = re.search(r"\[\.\.\. ([\d,]+) bytes omitted here \(lines (\d+)-([\d,]+) of", preview)
    assert marker is not None
    first, last = int(marker.group(2)), int(marker.group(3).replace(",", ""))
    head, tail = preview.split("\n", 1)[1].split(marker.group(0))
    assert head == "".join(lines[: first - 1])
    assert tail.split("\n", 1)[1] == "".join(lines[last:])
    omitted = len(text) - len(head) - len(tail.split("\n", 1)[1])
    assert int(marker.group(1).replace(",", "")) == omitted


def test_tail_start_keeps_whole_lines_within_both_limits():
    text = "".join(f"{i:04d}\n" for i in range(100))
    assert text[tail_start(text, 1000, 3) :] == "0097\n0098\n0099\n"
    assert text[tail_start(text, 12, 10) :] == "0098\n0099\n"
    euro = "abc€def"
    assert euro[tail_start(euro, 4, 5) :] == "def"  # never half a character
    assert euro[tail_start(euro, 6, 5) :] == "€def"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_is_rate_limited_and_ends_with_the_last_line():
    published: list[dict[str, Any]] = []
    clock = Clock()
    progress = LineProgress(published.append, interval=1.0, clock=clock)
    progress.feed("stdout", b"one\ntw")
    progress.feed("stdout", b"o\nthree\n")  # within the interval: not published
    clock.now = 1.5
    progress.feed("stderr", b"warn " + b"x" * 5000 + b"\nrest")
    progress.close()
    assert published == [
        {"stream": "stdout", "line": "one", "lines": 1},
        {"stream": "stderr", "line": "warn " + "x" * 495, "lines": 4},
        {"stream": "stderr", "line": "rest", "lines": 5},
    ]
