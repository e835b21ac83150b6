"""`bridges.mcp.pipes.connect_pipe` on asyncio and on uvloop: the pipe's descriptor is closed
once, by whoever closes it on that loop (asyncio's transport through the file object, uvloop's
through libuv), and by nobody else; a transport that cannot be made leaves nothing open. Real
pipes; the closes made through the file object are counted.
(`tests/hardening/test_descriptors.py` checks a whole daemon's closes under strace.)"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os

import pytest

from bridges.mcp import pipes

pytestmark = pytest.mark.anyio


def _is_open(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError as exc:
        assert exc.errno == errno.EBADF
        return False
    return True


async def _settle() -> None:
    """A few turns of the loop (a transport's close and write callbacks run)."""
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors `pipes` closed itself."""
    closed: list[int] = []

    def close(fd: int) -> None:
        closed.append(fd)
        os.close(fd)

    monkeypatch.setattr(pipes, "_close", close)
    return closed


async def test_a_read_pipe_is_closed_once_by_its_transport(closes: list[int]) -> None:
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    reader = asyncio.StreamReader()
    transport, _ = await pipes.connect_pipe(
        loop, lambda: asyncio.StreamReaderProtocol(reader), r, writes=False)
    os.write(w, b"line\n")
    assert await reader.readline() == b"line\n"
    transport.close()
    await _settle()
    assert not _is_open(r)
    # uvloop: libuv closed it; closing the file object too is what closed other threads' files
    assert closes == ([] if pipes.loop_closes_pipes(loop) else [r])
    os.close(w)


async def test_a_write_pipe_is_closed_once_by_its_transport(closes: list[int]) -> None:
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    transport, _ = await pipes.connect_pipe(loop, asyncio.Protocol, w, writes=True)
    transport.write(b"out")
    await _settle()
    assert os.read(r, 10) == b"out"
    transport.close()
    await _settle()
    assert not _is_open(w)
    assert closes == ([] if pipes.loop_closes_pipes(loop) else [w])
    os.close(r)


async def test_a_peer_that_leaves_closes_the_pipe_once(closes: list[int]) -> None:
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    lost = asyncio.Event()

    class Watching(asyncio.Protocol):
        def connection_lost(self, exc: Exception | None) -> None:
            lost.set()

    await pipes.connect_pipe(loop, Watching, w, writes=True)
    os.close(r)  # the reader is gone: the write transport closes itself
    await asyncio.wait_for(lost.wait(), 10)
    assert not _is_open(w)
    assert closes == ([] if pipes.loop_closes_pipes(loop) else [w])


async def test_a_protocol_that_cannot_be_made_leaves_the_descriptor_closed(
    closes: list[int],
) -> None:
    r, w = os.pipe()

    def broken() -> asyncio.Protocol:
        raise RuntimeError("no protocol")

    with pytest.raises(RuntimeError, match="no protocol"):
        await pipes.connect_pipe(asyncio.get_running_loop(), broken, r, writes=False)
    assert not _is_open(r)
    assert closes == [r]
    os.close(w)


@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])
async def test_a_regular_file_is_refused_and_closed(closes: list[int], tmp_path) -> None:
    """asyncio only: uvloop hands a regular file to epoll, which refuses it, and libuv aborts
    the process (the facade leaves a regular file to the SDK's threaded transport,
    `stdio_pipes`)."""
    fd = os.open(tmp_path / "file", os.O_RDONLY | os.O_CREAT)
    with pytest.raises(ValueError, match="for pipes/sockets only"):
        await pipes.connect_pipe(asyncio.get_running_loop(), asyncio.Protocol, fd, writes=False)
    assert not _is_open(fd)
    assert closes == [fd]
