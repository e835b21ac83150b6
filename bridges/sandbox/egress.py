"""The egress proxy of one sandbox with an allow-list `network`: HTTP CONNECT, on a Unix
socket in a private directory, to the listed host:port pairs only, every decision logged.
Imports nothing of ours; exports `EgressProxy`.

The sandbox has no network of its own (`--unshare-net`); its in-sandbox forwarder
(`bridges.sandbox.forward`) relays 127.0.0.1:3128 to this socket, so a connection to
anything else has nowhere to go. A destination matches by the exact host name (or address)
and port written in the allow-list; the proxy resolves the name. Anything but CONNECT
(a plain `GET http://...` through the proxy included) is refused with 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from types import TracebackType

log = logging.getLogger("bridges.sandbox.egress")

MAX_HEAD = 8192
HEAD_TIMEOUT = 10.0
CONNECT_TIMEOUT = 10.0


class EgressProxy:
    """`async with EgressProxy(allowed, name) as proxy:` serves on `proxy.path`."""

    def __init__(self, allowed: frozenset[tuple[str, int]], name: str) -> None:
        self._allowed = allowed
        self._name = name
        self._dir = ""
        self.path = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> EgressProxy:
        self._dir = tempfile.mkdtemp(prefix="sidecar-egress-")  # 0700
        self.path = os.path.join(self._dir, "egress.sock")
        self._server = await asyncio.start_unix_server(self._handle, self.path)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:  # cancelled on exit: Server.close() leaves connections open
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            writer.close()
            return
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        if len(parts) != 3 or parts[0] != "CONNECT":
            log.warning("[%s] egress refused: %s (only CONNECT to the sandbox's network "
                        "allow-list)", self._name, line[:200])
            await _answer(writer, "405 Method Not Allowed")
            return
        destination = _parse(parts[1])
        if destination is None or destination not in self._allowed:
            log.warning("[%s] egress refused: CONNECT %s (not in sandbox.network)",
                        self._name, parts[1][:200])
            await _answer(writer, "403 Forbidden")
            return
        host, port = destination
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            log.warning("[%s] egress: CONNECT %s:%d failed: %s", self._name, host, port, exc)
            await _answer(writer, "502 Bad Gateway")
            return
        log.info("[%s] egress: CONNECT %s:%d", self._name, host, port)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_splice(reader, up_writer))
                group.create_task(_splice(up_reader, writer))
        finally:
            writer.close()
            up_writer.close()


def _parse(target: str) -> tuple[str, int] | None:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]").lower(), int(port)


async def _answer(writer: asyncio.StreamWriter, status: str) -> None:
    with contextlib.suppress(OSError):
        writer.write(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                     .encode())
        await writer.drain()
    writer.close()


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass
