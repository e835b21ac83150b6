"""`PipeChunks`: a real OS pipe read by the loop, in order, with reading paused while more
than its limit waits to be taken, and its read end closed by `close()`."""

from __future__ import annotations

import asyncio
import fcntl
import os

import pytest

from bridges.manifest_tools.process import PipeChunks

pytestmark = pytest.mark.anyio

LIMIT = 256 * 1024


async def _open() -> tuple[PipeChunks, int]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    return PipeChunks(LIMIT, read_fd), write_fd


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            await asyncio.sleep(0.001)


async def _until_read(reader: PipeChunks) -> None:
    """Wait (up to 1 s) until the loop has read something from the pipe."""
    for _ in range(200):
        if reader._queued:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the loop read nothing from the pipe within 1 s")


async def test_chunks_arrive_whole_and_in_order_then_eof() -> None:
    reader, write_fd = await _open()
    data = bytes(range(256)) * (16 * 1024)  # 4 MiB
    writer = asyncio.create_task(_write_all(write_fd, data))
    got = bytearray()
    try:
        while len(got) < len(data):
            chunk = await reader.read()
            assert chunk
            got += chunk
        await writer
    finally:
        os.close(write_fd)
    assert await reader.read() == b""
    assert await reader.read() == b""
    assert bytes(got) == data
    reader.close()


async def test_reading_pauses_above_the_limit_and_resumes_when_taken() -> None:
    reader, write_fd = await _open()
    data = b"x" * (8 * 1024 * 1024)
    writer = asyncio.create_task(_write_all(write_fd, data))
    try:
        # Nobody takes chunks: the loop stops reading once more than LIMIT waits, so the
        # writer blocks on a full pipe instead of the reader buffering all 8 MiB.
        for _ in range(200):
            await asyncio.sleep(0.005)
        assert not writer.done()
        assert LIMIT < reader._queued < LIMIT + 2 * 1024 * 1024
        total = 0
        while total < len(data):
            total += len(await reader.read())
        await writer
    finally:
        os.close(write_fd)
    assert total == len(data)
    assert await reader.read() == b""
    reader.close()


async def test_a_lost_connection_raises_after_the_queued_chunks() -> None:
    reader = PipeChunks(LIMIT)  # driven as the loop drives a protocol
    reader.data_received(b"before")
    reader.connection_lost(OSError("pipe broke"))
    assert await reader.read() == b"before"
    with pytest.raises(OSError, match="pipe broke"):
        await reader.read()


async def test_close_stops_reading_closes_the_pipe_and_keeps_what_was_read() -> None:
    reader, write_fd = await _open()
    read_fd = reader._fd
    try:
        os.write(write_fd, b"kept")
        await _until_read(reader)
        reader.close()
        reader.close()  # twice is harmless
        with pytest.raises(OSError):
            os.fstat(read_fd)  # closed (a writer now gets EPIPE, not a full pipe)
        with pytest.raises(BrokenPipeError):
            os.write(write_fd, b"lost")
    finally:
        os.close(write_fd)
    assert await reader.read() == b"kept"
    assert await reader.read() == b""


async def test_reads_take_up_to_a_full_pipe_at_once() -> None:
    reader, write_fd = await _open()
    try:
        # Past the limit in one read: a chunk may be a whole pipe buffer (fewer, larger chunks).
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 1024 * 1024)
        os.write(write_fd, b"y" * (1024 * 1024))
        chunk = await reader.read()
    finally:
        os.close(write_fd)
        reader.close()
    assert len(chunk) > 256 * 1024  # a read pipe transport took at most 256 KiB


async def test_hold_hands_over_the_queued_chunks_and_the_pipe_until_release() -> None:
    reader, write_fd = await _open()
    try:
        os.write(write_fd, b"queued")
        await _until_read(reader)
        held = reader.hold()
        assert held == [b"queued"]
        os.write(write_fd, b"for the holder")
        for _ in range(20):  # the loop leaves a held pipe alone
            await asyncio.sleep(0.005)
        assert reader._queued == 0
        assert os.read(reader.fd, 100) == b"for the holder"
        os.write(write_fd, b"after release")
        reader.release()
        assert await reader.read() == b"after release"
    finally:
        os.close(write_fd)
    assert await reader.read() == b""
    assert reader.hold() is None  # at the end there is nothing to hand over
    reader.close()
    assert reader.fd == -1
