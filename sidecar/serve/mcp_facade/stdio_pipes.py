"""`sidecar stdio`'s wire on the event loop: stdin and stdout as asyncio pipes (`pipe_wire`,
whose docstring draws the wire and says what happens to fds 0 and 1), used when both are pipes
or sockets (how an agent spawns an MCP server). Anything else (a regular file, a terminal,
explicit streams) keeps the SDK's threaded transport: the event loop cannot watch a regular
file, and making a terminal non-blocking would leak into the shell that shares it. Why:
README.md.

Imports `sidecar.model`, `sidecar.serve.local_door` and the face `bridges.mcp` (`LineFramer`).
Exports `pipe_wire`, `PipeWire`, `READ_CHUNK`, `MAX_LINE_BYTES`, `FLUSH_GRACE` and
`EOF_GRACE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import socket
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from bridges.mcp import (
    LargeLine,
    LineFramer,
    LineReader,
    OversizedLine,
    connect_pipe,
    read_chunk,
    take_lines,
)
from sidecar.model import json_depth
from sidecar.serve.local_door import pipes_available as pipes_available

log = logging.getLogger("sidecar.mcp")

READ_CHUNK = 1 << 20
MAX_LINE_BYTES = 1 << 30
"""The largest request line accepted (1 GiB); a longer one is reported and skipped."""
FLUSH_GRACE = 5.0
"""How long the SDK's last messages may take to be written once serving ends."""
EOF_GRACE = 2.0
"""When stdin ends, how long requests read before the end still get to be answered (a client
that writes a request and closes stdin, as a shell pipeline does, gets its answer); what is
still running then is cancelled."""


@dataclass(slots=True)
class PipeWire:
    """What `serve_stdio` hands the SDK server and `FastCalls`."""

    read: MemoryObjectReceiveStream[SessionMessage | Exception]
    write: MemoryObjectSendStream[SessionMessage]
    send_line: Callable[[bytes], Any]
    """Writes one complete line (an awaitable; flow-controlled)."""


class _Unanswered:
    """Ids of the requests the SDK server was given and has not answered yet."""

    __slots__ = ("ids",)

    def __init__(self) -> None:
        self.ids: set[Any] = set()

    def asked(self, value: Any) -> None:
        if isinstance(value, dict) and "method" in value:
            if "id" in value:
                self.ids.add(_key(value["id"]))
            elif value["method"] == "notifications/cancelled":  # no answer will come
                params = value.get("params")
                if isinstance(params, dict):
                    self.ids.discard(_key(params.get("requestId")))

    def answered(self, message: types.JSONRPCMessage) -> None:
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            self.ids.discard(_key(message.id))


def _key(request_id: Any) -> Any:
    return request_id if isinstance(request_id, str) else str(request_id)


@asynccontextmanager
async def pipe_wire(
    take_raw: Callable[[Any], bool], busy: Callable[[], bool],
    *, fds: tuple[int, int] | None = None,
) -> AsyncIterator[PipeWire]:
    """Serve the wire on fds 0 and 1 (check `sidecar.serve.local_door.pipes_available` first), or
    on `fds` (a client's stdin and stdout handed to the daemon over its local door; the wire
    owns and closes them, and fds 0 and 1 are left alone). `take_raw` is offered every parsed
    message first; what it keeps is not passed on. `busy` says whether requests `take_raw`
    kept are still running (see `EOF_GRACE`).

        stdin  --LineFramer--> JSON --(FastCalls.take_raw)--> fast route, answered as JSON lines
                                     \\-> JSON-RPC model --memory stream--> the SDK server
        stdout <--one line per write-- fast answers, and the SDK server's messages (model dump)

    Like the SDK, on fds 0 and 1 it moves the wire off them while it serves (0 reads
    /dev/null, 1 writes to stderr), so children and stray prints cannot corrupt it, and puts
    both back on exit. A socket side runs on a socket transport, not a pipe transport; stdin
    and stdout on one socket share one transport. A write once the client has gone raises
    `ConnectionResetError`, which ends the session and nothing else."""
    loop = asyncio.get_running_loop()
    saved: tuple[int, int] | None = None
    if fds is None:
        saved = (_dup(0), _dup(1))
        wire_in, wire_out = _dup(0), _dup(1)
        _divert()
    else:
        wire_in, wire_out = fds
    to_sdk, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, from_sdk = anyio.create_memory_object_stream[SessionMessage](0)
    def taken(line: bytes) -> bool:  # a request line the fast route answers, as it arrives
        if not line.strip():
            return False  # (the loop skips it, as any blank line)
        try:
            value = json_depth.loads(line)
        except ValueError:
            return False  # answered by the loop as a parse error
        try:
            return take_raw(value)
        except Exception:  # not in the transport's callback: the loop meets it as before
            log.exception("stdio: the fast route failed on a request; the reader retries it")
            return False

    reader = LineReader(lambda data: take_lines(data, taken, MAX_LINE_BYTES),
                        limit=READ_CHUNK, loop=loop)
    opened: list[asyncio.BaseTransport] = []
    try:
        writer = await _open_wire(loop, reader, wire_in, wire_out, opened)

        async def send_line(line: bytes) -> None:
            if writer.transport.is_closing():  # uvloop would raise RuntimeError
                raise ConnectionResetError("the client's stdout is closed")
            writer.write(line)
            await writer.drain()

        written = anyio.Event()
        unanswered = _Unanswered()

        async def settled() -> None:
            # Polled, from two sources, and only once stdin has ended.
            with anyio.move_on_after(EOF_GRACE):
                while unanswered.ids or busy():  # noqa: ASYNC110
                    await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_lines, reader, take_raw, to_sdk, unanswered, settled, send_line)
            tg.start_soon(_write_messages, from_sdk, send_line, written, unanswered)
            try:
                yield PipeWire(read, write, send_line)
            finally:
                write.close()  # the writer ends once it wrote what the SDK queued
                with anyio.move_on_after(FLUSH_GRACE, shield=True):
                    await written.wait()
                tg.cancel_scope.cancel()
    finally:
        for transport in opened:
            transport.close()
        for stream in (to_sdk, read, write, from_sdk):
            stream.close()
        if saved is not None:
            _restore(*saved)


async def _open_wire(
    loop: asyncio.AbstractEventLoop, reader: asyncio.StreamReader, wire_in: int, wire_out: int,
    opened: list[asyncio.BaseTransport],
) -> asyncio.StreamWriter:
    """Transports that feed `reader` from `wire_in` and write to `wire_out`, appended to
    `opened` as they open; the writer. Owns both descriptors from the call on."""
    def reading() -> asyncio.Protocol:
        return asyncio.StreamReaderProtocol(reader, loop=loop)

    same = _socket_identity(wire_in)
    if same is not None and same == _socket_identity(wire_out):
        os.close(wire_out)
        transport, protocol = await _attach(loop, wire_in, reading, writes=False)
        opened.append(transport)
        return asyncio.StreamWriter(transport, protocol, reader, loop)
    try:
        transport, _ = await _attach(loop, wire_in, reading, writes=False)
    except BaseException:
        os.close(wire_out)
        raise
    opened.append(transport)
    transport, protocol = await _attach(loop, wire_out, lambda: _WriteOnly(loop=loop),
                                        writes=True)
    opened.append(transport)
    return asyncio.StreamWriter(transport, protocol, None, loop)


async def _attach(
    loop: asyncio.AbstractEventLoop, fd: int, protocol: Callable[[], asyncio.Protocol],
    *, writes: bool,
) -> tuple[Any, asyncio.Protocol]:
    """A socket transport on `fd` when it is a socket, else a pipe transport; `fd` is the
    transport's (closed here should it fail to open)."""
    if _socket_identity(fd) is None:  # closed once on uvloop too (`connect_pipe`)
        return await connect_pipe(loop, protocol, fd, writes=writes)
    owner = socket.socket(fileno=fd)
    try:
        return await loop.connect_accepted_socket(protocol, owner)
    except BaseException:
        owner.close()
        raise


class _WriteOnly(asyncio.streams.FlowControlMixin, asyncio.Protocol):
    """The protocol of stdout alone: what a socket's peer sends is dropped, and its half-close
    leaves our side writable."""

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return True


def _socket_identity(fd: int) -> tuple[int, int] | None:
    """(device, inode) of `fd` when it is a socket, else None."""
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino) if stat.S_ISSOCK(info.st_mode) else None


async def _read_lines(
    reader: asyncio.StreamReader,
    take_raw: Callable[[Any], bool],
    sink: MemoryObjectSendStream[SessionMessage | Exception],
    unanswered: _Unanswered,
    settled: Callable[[], Awaitable[None]],
    send_line: Callable[[bytes], Awaitable[None]],
) -> None:
    framer = LineFramer(MAX_LINE_BYTES)
    try:
        async with sink:
            while chunk := await read_chunk(reader, READ_CHUNK,
                                            held=framer.buffered_bytes > 0):
                framer.feed(chunk)
                del chunk
                while (line := framer.pop()) is not None:
                    assert not isinstance(line, LargeLine)  # lines are never streamed here
                    item = _parse(line, take_raw, unanswered)
                    if isinstance(item, _Refused):
                        log.debug("stdio: %s", item.message)
                        await send_line(item.line())
                    elif item is not None:
                        await sink.send(item)
            await settled()  # end of input: answer what was asked, briefly
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
        pass


@dataclass(frozen=True, slots=True)
class _Refused:
    """A line answered with a JSON-RPC error at once (the SDK server would only log it)."""

    code: int
    message: str
    request_id: Any = None

    def line(self) -> bytes:
        error = {"code": self.code, "message": self.message}
        return json.dumps({"jsonrpc": "2.0", "id": self.request_id, "error": error}).encode() \
            + b"\n"


def _parse(
    line: bytes | OversizedLine, take_raw: Callable[[Any], bool], unanswered: _Unanswered
) -> Any:
    """The item for the SDK server (a message, or the error it reports), a `_Refused` line
    to answer at once, or None."""
    if isinstance(line, OversizedLine):
        return ValueError(f"a request of {line.size:,} bytes is over {MAX_LINE_BYTES:,}; skipped")
    if len(line) < 16 and not line.strip():  # blank; a long line is never copied to check
        return None
    try:
        value = json_depth.loads(line)
    except ValueError as exc:  # JSON-RPC 2.0: a parse error is answered, with a null id
        return _Refused(types.PARSE_ERROR, f"Parse error: {exc}")
    if take_raw(value):
        return None
    try:
        message = types.jsonrpc_message_adapter.validate_python(value, by_name=False)
    except ValidationError as exc:
        request_id = value.get("id") if isinstance(value, dict) else None
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            request_id = None
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "$"
        return _Refused(types.INVALID_REQUEST,
                        f"Invalid request: not a JSON-RPC 2.0 message ({where}: {first['msg']})",
                        request_id)
    unanswered.asked(value)
    return SessionMessage(message)


async def _write_messages(
    source: MemoryObjectReceiveStream[SessionMessage],
    send_line: Callable[[bytes], Any],
    written: anyio.Event,
    unanswered: _Unanswered,
) -> None:
    try:
        async with source:
            async for message in source:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await send_line(data.encode() + b"\n")
                unanswered.answered(message.message)
    except (ConnectionError, anyio.ClosedResourceError, anyio.BrokenResourceError):
        log.debug("stdout closed; the client is gone")
    finally:
        written.set()


def _dup(fd: int) -> int:
    """A close-on-exec duplicate above the standard descriptors."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


def _divert() -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(devnull, 0)
    finally:
        os.close(devnull)
    os.dup2(2, 1)


def _restore(stdin: int, stdout: int) -> None:
    for saved, fd in ((stdin, 0), (stdout, 1)):
        with contextlib.suppress(OSError):
            os.set_blocking(saved, True)  # asyncio made the shared description non-blocking
            os.dup2(saved, fd)
        os.close(saved)
