"""The stdio transport: our own child process and pipes, fed to the SDK's session. Imports the
rest of `bridges`; exports `stdio_transport` (and re-exports `DirectRequests`, `StderrTail`).

    stdout --LineFramer--> SessionMessage --memory stream--> ClientSession
    stdin  <--JSON line--- SessionMessage <--memory stream-- ClientSession
    stderr --StderrTail--> log lines (redacted) + last 64 KiB for health and errors

Tool calls take a shorter way (`DirectRequests`): the bridge writes the `tools/call` line on
stdin itself and the stdout pump hands the answer (and the call's progress and log
notifications) straight back to it, as a plain dict, before any SDK parsing; a direct answer
is handed back only once the notifications read before it have been handled. The answer is
taken as its bytes arrive, in the pipe's callback (stdout is a `framing.LineReader`), while the
pump waits with nothing held; otherwise the pump takes it in order. Everything else
(handshake, listings, requests from the server) goes through the SDK session. The child runs
in its own session and process group (`start_new_session`), gets only a safe subset of our
environment plus its `env` (the SDK's policy), or runs under bubblewrap when its entry says
`sandbox` (`bridges.sandbox`), and is stopped in steps (`_stop`): stdin closed, SIGTERM,
SIGKILL, to the whole group, so nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol, cast

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage
from pydantic_core import from_json

from bridges.child_groups import CHILD_GROUPS, die_with_parent, group_alive
from bridges.mcp.direct_requests import DIRECT_ID_PREFIX as DIRECT_ID_PREFIX
from bridges.mcp.direct_requests import RESULT_TOO_LARGE as RESULT_TOO_LARGE
from bridges.mcp.direct_requests import ConnectionLost as ConnectionLost
from bridges.mcp.direct_requests import DirectRequests as DirectRequests
from bridges.mcp.direct_requests import LogFn as LogFn
from bridges.mcp.direct_requests import RequestTimedOut as RequestTimedOut
from bridges.mcp.framing import (
    PARSE_OFF_LOOP_AT,
    InvalidAnswer,
    LargeLine,
    LineFramer,
    LineReader,
    OversizedLine,
    drain_messages,
    offer_large,
    read_chunk,
    take_lines,
)
from bridges.mcp.pipes import connect_pipe
from bridges.mcp.stderr_tail import STDERR_TAIL_BYTES as STDERR_TAIL_BYTES
from bridges.mcp.stderr_tail import StderrTail as StderrTail
from bridges.mcp.transport_state import TransportState
from bridges.prestart import PRESTARTED, StdioSpec
from bridges.prestart import stop as stop_prestarted  # `_stop` here is the async one
from bridges.sandbox import PROTECTED, explain_exit, sandboxed

log = logging.getLogger("bridges.mcp.stdio")

READ_CHUNK = 1 << 20
STREAM_LINES_AT = 8 << 20
"""A line from a server longer than this is parsed as it arrives (`bridges.mcp.framing`): a
large text result is then held once, not twice."""
STDIN_CLOSE_GRACE = 2.0
"""Seconds a server gets to exit by itself once its stdin is closed."""
UNSTARTED_GRACE = 0.2
"""The same for a server that never finished starting (it hangs or is failing anyway)."""
TERM_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL."""
_POLL = 0.01




@asynccontextmanager
async def stdio_transport(
    spec: StdioSpec,
    *,
    server: str,
    stderr: StderrTail,
    info: TransportState,
    direct: DirectRequests | None = None,
    on_spawned: Callable[[], None] = lambda: None,
) -> AsyncIterator[TransportStreams]:
    """Spawn the server and yield the (read, write) streams the SDK session speaks; `direct`,
    when given, is attached to the same pipes.

    Raises `OSError` when the command cannot be started. On exit (normal, error or
    cancellation) the child is stopped and reaped before this returns.
    """
    proc: Child
    direct = direct if direct is not None else DirectRequests()
    answers = functools.partial(_direct_answer, direct)
    limit = min(PARSE_OFF_LOOP_AT, spec.max_message_bytes)

    def stdout_lines(data: bytes) -> int:  # answers to direct requests, as they arrive
        return take_lines(data, answers, limit)

    sandbox = contextlib.AsyncExitStack()  # the egress proxy of an allow-list, if any
    ran: list[str] = []  # the sandboxed argv: its cgroup says which limit it hit
    prestarted = PRESTARTED.claim(spec)
    if prestarted is not None:
        try:
            proc = await _Adopted.of(prestarted, stdout_lines)
        except BaseException:  # claimed, so nobody else would stop it
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(stop_prestarted, prestarted)
            raise
        log.debug("[%s] adopted the server started before the daemon's imports (pid %d)",
                  server, proc.pid)
    else:
        argv = [spec.command, *spec.args]
        try:
            if spec.sandbox is not None:  # bwrap's argv (`bridges.sandbox`)
                argv = ran = await sandbox.enter_async_context(sandboxed(
                    spec.sandbox, argv, cwd=spec.cwd, env=spec.env, name=server, owner=info))
            loop = asyncio.get_running_loop()
            transport, protocol = await loop.subprocess_exec(
                lambda: _ChildProtocol(stdout_lines, limit=READ_CHUNK, loop=loop),
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=spec.child_environment(),
                cwd=spec.cwd,
                start_new_session=True,
                preexec_fn=die_with_parent(),  # dies with the daemon (`bridges.child_groups`)
            )
            proc = asyncio.subprocess.Process(transport, protocol, loop)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await sandbox.aclose()
            raise
    CHILD_GROUPS.add(proc.pid)  # reaped at the next start if the daemon dies first
    PROTECTED.working_dir(info, spec.cwd)  # hidden from the other servers' sandboxes
    info.pid, info.returncode = proc.pid, None
    stderr.started()
    on_spawned()
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    assert proc.stdin is not None
    direct.attach(proc.stdin, read_writer.aclose)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                _pump_stdout, proc, read_writer, spec.max_message_bytes, server, info, direct,
                functools.partial(explain_exit, spec.sandbox, None, "", ran)
                if spec.sandbox is not None else None,
            )
            tg.start_soon(_pump_stdin, proc, write_reader, read_writer)
            tg.start_soon(_pump_stderr, proc, stderr)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(proc, STDIN_CLOSE_GRACE if info.ready else UNSTARTED_GRACE)
                    info.returncode = proc.returncode
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:  # the task group failed before the yield
                await _stop(proc, UNSTARTED_GRACE)
            info.returncode = proc.returncode
            CHILD_GROUPS.remove(proc.pid)  # `_stop` swept the whole group
            PROTECTED.working_dir(info, None)
            await sandbox.aclose()
            stderr.flush()
            direct.close()
            for stream in (read_writer, read_stream, write_stream, write_reader):
                await stream.aclose()
            _close_transport(proc)


async def _pump_stdout(
    proc: Child,
    out: MemoryObjectSendStream[SessionMessage | Exception],
    max_message_bytes: int,
    server: str,
    state: TransportState,
    direct: DirectRequests,
    sandbox_limit: Callable[[], str | None] | None = None,
) -> None:
    assert proc.stdout is not None
    framer = LineFramer(max_message_bytes, stream_at=STREAM_LINES_AT)
    try:
        while chunk := await read_chunk(proc.stdout, READ_CHUNK,
                                        held=framer.buffered_bytes > 0):
            framer.feed(chunk)
            del chunk
            for drained in drain_messages(framer, direct.claims, direct.deliver,
                                          defer_large=True):
                item: SessionMessage | OversizedLine | ValueError | None
                if isinstance(drained, LargeLine):
                    item = await _parse_large(drained, direct, server)
                else:
                    item = drained
                del drained
                if item is None:  # a direct answer, taken (or refused: over its limit)
                    continue
                if isinstance(item, OversizedLine):
                    error, request_id = _too_large(item, max_message_bytes, server)
                    if request_id is None:  # unanswerable: end the connection; every waiter learns
                        state.closing_reason = _too_large_message(item.size, max_message_bytes)
                        return
                    if not direct.fail(request_id, error):
                        await out.send(SessionMessage(
                            types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)))
                elif isinstance(item, InvalidAnswer):  # fail that request now, not at its timeout
                    log.warning("[%s] invalid answer to request %r: %s", server,
                                item.request_id, item)
                    error = types.ErrorData(code=types.INTERNAL_ERROR, message=(
                        f"the server's answer is not a valid JSON-RPC response: {item}"))
                    if not direct.fail(item.request_id, error):
                        await out.send(SessionMessage(types.JSONRPCError(
                            jsonrpc="2.0", id=item.request_id, error=error)))
                elif isinstance(item, ValueError):
                    log.warning("[%s] ignored a line on stdout: %s", server, item)
                else:
                    await out.send(item)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
        pass
    finally:
        if state.closing_reason is None and sandbox_limit is not None:
            state.closing_reason = sandbox_limit()  # a limit of its cgroup it ran into
        direct.close()
        await out.aclose()


class _ChildProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """`asyncio.create_subprocess_exec`'s protocol, with the child's stdout read by a
    `LineReader`: answers to direct requests are handed over as they arrive."""

    def __init__(self, take: Callable[[bytes], int], *, limit: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self._take = take
        self._reader_limit = limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # (uvloop's process transport is no `asyncio.SubprocessTransport` subclass)
        stdout = cast("asyncio.SubprocessTransport", transport).get_pipe_transport(1)
        if stdout is not None:
            reader = LineReader(self._take, limit=self._reader_limit,
                                loop=asyncio.get_running_loop())
            reader.set_transport(stdout)
            self.stdout = reader


def _direct_answer(direct: DirectRequests, line: bytes) -> bool:
    """Whether `line` (a whole line of stdout, as it arrived) answered a direct request or
    reported on one, and was taken: as `drain_messages` would take it."""
    if not direct.claims(line):
        return False
    try:  # as `json_depth.loads`: pydantic-core first, the standard library for the rest
        value = from_json(line)
    except ValueError:
        text = line.decode("utf-8", "replace")
        if len(text) < 16 and not text.strip():
            return False
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return False  # the pump says what was wrong with it
    try:
        return direct.deliver(value)
    except Exception:  # not in the transport's callback: the pump meets it as before
        log.exception("a direct answer could not be handed over; the pump retries it")
        return False


async def _parse_large(
    line: LargeLine, direct: DirectRequests, server: str
) -> SessionMessage | ValueError | None:
    """A large line parsed in a worker thread, in bounded steps (`framing.LargeLine`), so the
    event loop goes on serving while it parses; None when a direct request took it, or refused
    it without parsing it (over that request's `max_answer_bytes`)."""
    claimed = direct.claims(line.skeleton)
    if claimed and direct.refuse_large(line.edges(), server):
        return None
    # Not abandoned on cancellation: the thread would go on parsing anyway.
    value, message = await anyio.to_thread.run_sync(line.parse, not claimed)
    if value is None:
        return message
    return offer_large(line, value, direct.deliver)


def _too_large_message(size: int, limit: int) -> str:
    return (
        f"the server sent a message of {size:,} bytes, over max_result_bytes "
        f"({limit:,} bytes); raise max_result_bytes for this server to accept it"
    )


def _too_large(
    line: OversizedLine, limit: int, server: str
) -> tuple[types.ErrorData, int | str | None]:
    """The error that answers an oversized line, and the request it answers (None: unknown)."""
    message = _too_large_message(line.size, limit)
    request_id = line.request_id()
    log.warning("[%s] %s (request id %r)", server, message, request_id)
    return types.ErrorData(code=RESULT_TOO_LARGE, message=message), request_id


async def _pump_stdin(
    proc: Child,
    messages: MemoryObjectReceiveStream[SessionMessage],
    read_writer: MemoryObjectSendStream[SessionMessage | Exception],
) -> None:
    assert proc.stdin is not None
    try:
        async with messages:
            async for message in messages:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                proc.stdin.write(data.encode() + b"\n")
                await proc.stdin.drain()
    except (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError):
        # The child is gone or stopped reading: end the session's view of the connection
        # instead of letting a request wait forever.
        await read_writer.aclose()


async def _pump_stderr(proc: Child, tail: StderrTail) -> None:
    assert proc.stderr is not None
    try:
        with contextlib.suppress(OSError):
            while chunk := await proc.stderr.read(65536):
                tail.feed(chunk)
    finally:
        tail.ended()


async def _stop(proc: Child, grace: float) -> None:
    """Close stdin, wait `grace`, SIGTERM the group, wait, SIGKILL it; then sweep survivors:
    members of the group that outlive the leader get the same SIGTERM, then SIGKILL."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError, RuntimeError):
            proc.stdin.close()
    pgid = proc.pid  # start_new_session: the child leads its own group
    if not await _exited(proc, grace):
        _signal_group(pgid, signal.SIGTERM)
        if not await _exited(proc, TERM_GRACE):
            _signal_group(pgid, signal.SIGKILL)
            await _exited(proc, TERM_GRACE)
    # A live group keeps its id from being reused, so signalling it here is safe. Its dead
    # members (a grandchild init has not reaped yet) do not count: `group_alive`.
    if await anyio.to_thread.run_sync(group_alive, pgid):
        _signal_group(pgid, signal.SIGTERM)
        for _ in range(int(TERM_GRACE / _POLL)):
            if not await anyio.to_thread.run_sync(group_alive, pgid):
                return
            await anyio.sleep(_POLL)
        _signal_group(pgid, signal.SIGKILL)


async def _exited(proc: Child, within: float) -> bool:
    # Polling, not proc.wait(): wait() also waits for pipe EOF, which a grandchild that
    # inherited the pipes can hold open after the server itself exited.
    deadline = anyio.current_time() + within
    while proc.returncode is None:
        if anyio.current_time() >= deadline:
            return False
        await anyio.sleep(_POLL)
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _close_transport(proc: Child) -> None:
    if isinstance(proc, _Adopted):
        proc.close()
        return
    # asyncio warns at garbage collection about a subprocess transport nobody closed, and
    # there is no public way to reach it.
    transport = getattr(proc, "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


class Child(Protocol):
    """The part of `asyncio.subprocess.Process` this module uses."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None


class _Adopted:
    """A server the CLI started before its imports (`bridges.prestart`), with asyncio streams
    on its pipes. `returncode` polls (`waitpid` with `WNOHANG`), as `_exited` asks."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        transports: tuple[asyncio.BaseTransport, ...],
    ) -> None:
        self._process = process
        self.stdin: asyncio.StreamWriter | None = stdin
        self.stdout: asyncio.StreamReader | None = stdout
        self.stderr: asyncio.StreamReader | None = stderr
        self._transports = transports

    @classmethod
    async def of(cls, process: subprocess.Popen[bytes],
                 take: Callable[[bytes], int] | None = None) -> _Adopted:
        """`take`: stdout is a `LineReader` handing lines over to it, as the spawned ones.
        The pipes' descriptors move to the transports (`connect_pipe`: closed once); the
        process's file objects are closed."""
        assert process.stdin is not None and process.stdout is not None
        assert process.stderr is not None
        pipes = (process.stdout, process.stderr, process.stdin)
        fds: list[int] = []
        try:
            fds.extend(os.dup(pipe.fileno()) for pipe in pipes)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        for pipe in pipes:
            pipe.close()
        loop = asyncio.get_running_loop()
        transports: list[asyncio.BaseTransport] = []

        async def reader(fd: int,
                         take: Callable[[bytes], int] | None = None) -> asyncio.StreamReader:
            stream = (asyncio.StreamReader(limit=READ_CHUNK, loop=loop) if take is None
                      else LineReader(take, limit=READ_CHUNK, loop=loop))  # as the spawned ones
            read, _ = await connect_pipe(
                loop, functools.partial(asyncio.StreamReaderProtocol, stream, loop=loop), fd,
                writes=False)
            transports.append(read)
            return stream

        try:
            stdout = await reader(fds.pop(0), take)
            stderr = await reader(fds.pop(0))
            write, protocol = await connect_pipe(
                loop, functools.partial(asyncio.streams.FlowControlMixin, loop=loop),
                fds.pop(0), writes=True)
            transports.append(write)
        except BaseException:
            for fd in fds:  # not handed over yet
                os.close(fd)
            for transport in transports:
                transport.close()
            raise
        stdin = asyncio.StreamWriter(write, protocol, None, loop)
        return cls(process, stdin, stdout, stderr, tuple(transports))

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.poll()

    def close(self) -> None:
        for transport in self._transports:
            transport.close()
