"""Pipe transports that close their descriptor exactly once, on uvloop as on asyncio. Imports
nothing of the project; exports `connect_pipe`.

    transport, protocol = await connect_pipe(loop, factory, fd, writes=False)

`loop.connect_read_pipe(factory, file)` and `connect_write_pipe` take a file object. The
asyncio loop's transport closes the descriptor through that object (`file.close()`); uvloop's
hands the number to libuv, which closes it when the transport closes, and then closes the file
object too (MagicStack/uvloop#763, open on uvloop 0.23): a second `close(2)` of a number that
another thread may have been given in between. That thread loses its descriptor (a SQLite
file, a socket), or libuv loses one it watches and aborts the process (`uv__epoll_ctl_flush`:
`sidecar serve` with a server that exits at start died with SIGABRT in about one start of 150,
six starting at once). Here the transport gets a file object whose `close()` closes the
descriptor only on a loop whose transport does not close it itself.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any, TypeVar

P = TypeVar("P", bound=asyncio.BaseProtocol)

_close = os.close  # (tests count the closes)


def loop_closes_pipes(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop`'s pipe transports close the descriptor themselves (uvloop, libuv)."""
    return type(loop).__module__.startswith("uvloop")


class _Descriptor:
    """The file object a pipe transport holds: `fileno()` for the loop, `close()` once."""

    def __init__(self, fd: int, *, closes: bool) -> None:
        self._fd = fd
        self._closes = closes

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("I/O operation on closed pipe")
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0 and self._closes:
            _close(fd)

    def __repr__(self) -> str:
        return f"<pipe fd={self._fd}>"


async def connect_pipe(
    loop: asyncio.AbstractEventLoop, factory: Callable[[], P], fd: int, *, writes: bool
) -> tuple[Any, P]:
    """A read (or, with `writes`, write) pipe transport on `fd`, which it owns from the call
    on: the transport closes it once when it closes, or this closes it when the transport
    cannot be made. (One case is left open: uvloop refusing to register the descriptor at
    all, which libuv then never closed; nothing is closed twice.)"""
    try:
        protocol = factory()
    except BaseException:
        _close(fd)
        raise
    pipe = _Descriptor(fd, closes=not loop_closes_pipes(loop))
    try:
        if writes:
            return await loop.connect_write_pipe(lambda: protocol, pipe)
        return await loop.connect_read_pipe(lambda: protocol, pipe)
    except BaseException:
        pipe.close()
        raise
