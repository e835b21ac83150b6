"""`SpoolWriter.write_from`: a producer's pipe read into a spool by the spool's own threads."""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import termios
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from store_helpers import editor_lines, eventually, files_in

from managed_store import Drained, FdSpool, ManagedStore, RetentionError, StoreClosed
from managed_store.spool import TAIL_BYTES

pytestmark = pytest.mark.anyio


def _store_threads() -> list[str]:
    """A spool's threads: its worker and `write_from`'s appender."""
    prefixes = ("managed-store-spool", "managed-store-append")
    return [t.name for t in threading.enumerate() if t.name.startswith(prefixes)]


def _unread(fd: int) -> int:
    """Bytes waiting in the pipe whose read end is `fd`."""
    buf = fcntl.ioctl(fd, termios.FIONREAD, struct.pack("i", 0))
    return int(struct.unpack("i", buf)[0])


class Producer:
    """The write end of a pipe, fed from a thread: each piece is written once the previous
    one was read, so each arrives as a read of its own (pieces shorter than a pipe)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.written = 0
        self._done = threading.Event()

    def feed(self, pieces: Sequence[bytes], *, close: bool = True) -> threading.Thread:
        def run() -> None:
            try:
                for piece in pieces:
                    while _unread(self.read_fd):
                        time.sleep(0.001)
                    os.write(self.write_fd, piece)
                    self.written += len(piece)
                if close:
                    os.close(self.write_fd)
                    self.write_fd = -1
            except BrokenPipeError:
                pass  # the reader went away: what a producer sees, too
            finally:
                self._done.set()

        thread = threading.Thread(target=run, name="test-producer")
        thread.start()
        return thread

    def stream(self, piece: bytes, stop: threading.Event) -> threading.Thread:
        """Write `piece` again and again (blocking when the pipe is full) until `stop`."""

        def run() -> None:
            try:
                while not stop.is_set():
                    os.write(self.write_fd, piece)
                    self.written += len(piece)
            except BrokenPipeError:
                pass

        thread = threading.Thread(target=run, name="test-producer")
        thread.start()
        return thread


@contextmanager
def pipe() -> Iterator[Producer]:
    read_fd, write_fd = os.pipe()
    producer = Producer(read_fd, write_fd)
    try:
        yield producer
    finally:
        for fd in (producer.read_fd, producer.write_fd):
            if fd >= 0:
                os.close(fd)


async def test_write_from_reads_a_pipe_to_its_end_after_earlier_writes(store: ManagedStore):
    pieces = [
        b"first line\n",
        "caf\u00e9 ".encode()[:4],  # ends inside the two-byte \u00e9 ...
        "caf\u00e9 ".encode()[4:] + "\u20ac\n".encode()[:2],  # ... which ends here; \u20ac opens
        "\u20ac\n".encode()[2:] + b"plain ascii\n" * 3,
        b"0123456789abcdef\n" * 120_000,  # more than a pipe holds: several reads
        "\U0001f600 last line, no newline".encode(),
    ]
    data = b"".join(pieces)
    with pipe() as producer:
        async with store.open_spool() as spool:
            assert isinstance(spool, FdSpool)
            await spool.write("written before\n")
            drained = Drained(limit=1 << 40)
            feeding = producer.feed(pieces)
            await spool.write_from(producer.read_fd, drained)
            ref = await spool.commit()
        feeding.join()
        os.fstat(producer.read_fd)  # still open: it is the caller's to close

    assert drained.ended and drained.leftover == b""
    assert (drained.kept, drained.dropped) == (len(data), 0)
    assert drained.tail == data[-TAIL_BYTES:]
    whole = b"written before\n" + data
    assert (ref.size_bytes, ref.lines) == (len(whole), len(editor_lines(whole)))
    read = await store.read_bytes(ref.id, 0, len(whole) + 1)
    assert read.text.encode() == whole
    await eventually(lambda: not _store_threads())


async def test_bytes_past_the_limit_are_read_and_counted_not_written(store: ManagedStore):
    # The limit falls inside the two-byte \u00e9: its first byte is kept but cannot be written.
    kept = b"k" * 999 + "\u00e9".encode()[:1]
    pieces = [b"k" * 999 + "\u00e9".encode(), b"dropped\n" * 10_000, b"x" * 300_000]
    with pipe() as producer:
        async with store.open_spool() as spool:
            drained = Drained(limit=1000)
            feeding = producer.feed(pieces)
            await spool.write_from(producer.read_fd, drained)
            ref = await spool.commit()
        feeding.join()  # never blocked on a full pipe: everything was read

    total = sum(map(len, pieces))
    assert drained.ended and producer.written == total
    assert (drained.kept, drained.dropped) == (1000, total - 1000)
    assert drained.leftover == kept[-1:]
    assert ref.size_bytes == 999
    assert (await store.read_bytes(ref.id, 0, 2000)).text == "k" * 999


async def test_reading_stops_at_bytes_that_are_not_utf8_and_leaves_the_rest(store: ManagedStore):
    pieces = [b"good\n", b"\xc3", b"(bad \xff byte)\n"]
    with pipe() as producer:
        async with store.open_spool() as spool:
            drained = Drained(limit=1 << 40)
            feeding = producer.feed([*pieces, b"after\n"])
            await spool.write_from(producer.read_fd, drained)
            assert not drained.ended
            assert drained.leftover == b"\xc3(bad \xff byte)\n"
            assert drained.kept == sum(map(len, pieces))
            feeding.join()
            assert os.read(producer.read_fd, 100) == b"after\n"  # left in the pipe, unread
            ref = await spool.commit()
    assert (await store.read_bytes(ref.id, 0, 100)).text == "good\n"


async def test_cancelling_on_a_quiet_pipe_stops_promptly_and_keeps_the_spool(store: ManagedStore):
    with pipe() as producer:
        async with store.open_spool() as spool:
            drained = Drained(limit=1 << 40)
            reading = asyncio.create_task(spool.write_from(producer.read_fd, drained))
            producer.feed([b"some output\n", "\u00e9".encode()[:1]], close=False)
            await eventually(lambda: drained.kept == 13)
            started = time.monotonic()
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            assert time.monotonic() - started < 1, "the thread waits in poll(), not in read()"
            assert not any(t.endswith("append") for t in _store_threads())
            assert drained.leftover == b"\xc3" and not drained.ended
            ref = await spool.commit()  # what was read stays: the spool is still open
        os.write(producer.write_fd, b"x")  # the reader let go: nothing reads this any more
        assert _unread(producer.read_fd) == 1
    assert (await store.read_bytes(ref.id, 0, 100)).text == "some output\n"


async def test_a_full_disk_stops_write_from_and_leaves_nothing(tiny_fs_root: Path):
    async with await ManagedStore.open(tiny_fs_root) as store:
        with pipe() as producer:
            async with store.open_spool() as spool:
                feeding = producer.feed([b"line of output\n" * 40_000])
                with pytest.raises(RetentionError, match=r"No space left|no space"):
                    await spool.write_from(producer.read_fd, Drained(limit=1 << 40))
                with pytest.raises(StoreClosed, match="aborted"):
                    await spool.commit()
            os.close(producer.read_fd)  # a producer still writing gets EPIPE
            producer.read_fd = -1
            feeding.join()
        assert files_in(tiny_fs_root) == []
    await eventually(lambda: not _store_threads())


async def test_the_quota_stops_write_from_with_a_retention_error(tmp_path: Path):
    async with await ManagedStore.open(tmp_path / "s", quota_bytes=100_000) as store:
        with pipe() as producer:
            async with store.open_spool() as spool:
                stop = threading.Event()
                streaming = producer.stream(b"y" * 4096, stop)
                try:
                    with pytest.raises(RetentionError, match="quota of 100000 bytes"):
                        await spool.write_from(producer.read_fd, Drained(limit=1 << 40))
                finally:
                    stop.set()
                    os.close(producer.read_fd)
                    producer.read_fd = -1
                    streaming.join()
        assert files_in(tmp_path / "s") == []


async def test_closing_the_store_under_write_from_is_store_closed(store: ManagedStore, root: Path):
    with pipe() as producer:
        spool = store.open_spool()
        await spool.__aenter__()
        stop = threading.Event()
        streaming = producer.stream(b"z" * 65536, stop)
        try:
            reading = asyncio.create_task(spool.write_from(producer.read_fd, Drained(1 << 40)))
            await eventually(lambda: producer.written > 1 << 20)
            await store.aclose()
            with pytest.raises(StoreClosed):
                await reading
        finally:
            stop.set()
            os.close(producer.read_fd)
            producer.read_fd = -1
            streaming.join()
        await spool.__aexit__(None, None, None)
    assert files_in(root) == []
    await eventually(lambda: not _store_threads())


async def test_write_from_after_an_open_character_is_refused(store: ManagedStore, root: Path):
    with pipe() as producer:
        async with store.open_spool() as spool:
            await spool.write(b"ends inside \xe2\x82")
            with pytest.raises(RetentionError, match="inside a UTF-8 character"):
                await spool.write_from(producer.read_fd, Drained(limit=1 << 40))
            with pytest.raises(StoreClosed, match="aborted"):
                await spool.commit()
    assert files_in(root) == []
