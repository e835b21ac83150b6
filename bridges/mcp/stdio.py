"""The stdio transport: our own child process and pipes, fed to the SDK's session.

We spawn the server ourselves instead of using `mcp.client.stdio.stdio_client`, for three
reasons: the SDK's reader is quadratic in the line length (see `framing`), we want the child's
stderr in our log and its last 64 KiB for error messages, and we want to own the shutdown.

    stdout --LineFramer--> SessionMessage --memory stream--> ClientSession
    stdin  <--JSON line--- SessionMessage <--memory stream-- ClientSession
    stderr --StderrTail--> log lines (redacted) + last 64 KiB for health and errors

Tool calls take a shorter way (`DirectRequests`): the bridge writes the `tools/call` line on
stdin itself and the stdout pump hands the answer (and the call's progress notifications)
straight back to it, as a plain dict, before any SDK parsing. Everything else (handshake,
listings, notifications, requests from the server) goes through the SDK session as above. The
SDK's dispatcher costs about as much CPU per call as the rest of the bridge together (pydantic
models for every message, two memory streams and a task switch each way, a tracing span); the
direct way keeps its behaviour (ids, progress tokens, timeouts with a courtesy
`notifications/cancelled`, cancellation forwarded, every waiter failed with CONNECTION_CLOSED
when the pipe ends) without that machinery.

Log messages (`notifications/message`) take the direct way too, and a direct answer is handed
back only once the progress and log notifications read before it have been handled: a server
that logs "done" and then answers must not have its log line arrive after the call has ended
(it would then reach no client, having no call to follow).

The child runs in its own session and process group (`start_new_session`), gets only a safe
subset of our environment plus its `env` (the SDK's policy), and is stopped in steps: close its
stdin, then SIGTERM to the group, then SIGKILL to the group; members of the group that outlive
the leader get the same treatment, so nothing is left behind.
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
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import IO, Any, Protocol

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client._transport import TransportStreams
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from bridges.child_groups import CHILD_GROUPS, die_with_parent
from bridges.mcp.framing import InvalidAnswer, LineFramer, OversizedLine, drain_messages
from bridges.mcp.log_budget import LogBudget
from bridges.mcp.redact import Redactor
from bridges.mcp.transport_state import TransportState
from bridges.prestart import PRESTARTED, StdioSpec
from bridges.prestart import stop as stop_prestarted  # `_stop` here is the async one

log = logging.getLogger("bridges.mcp.stdio")

READ_CHUNK = 1 << 20
STREAM_LINES_AT = 8 << 20
"""A line from a server longer than this is parsed as it arrives (`bridges.mcp.framing`): a
large text result is then held once, not twice."""
STDERR_TAIL_BYTES = 64 * 1024
_STDERR_LINE_LIMIT = 4096
STDIN_CLOSE_GRACE = 2.0
"""Seconds a server gets to exit by itself once its stdin is closed."""
UNSTARTED_GRACE = 0.2
"""The same for a server that never finished starting (it hangs or is failing anyway)."""
TERM_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL."""
_POLL = 0.01

RESULT_TOO_LARGE = -32099
"""Our JSON-RPC error code for a message over `max_result_bytes` (server-error range)."""

DIRECT_ID_PREFIX = "mcp-sidecar/"
"""Ids (and progress tokens) of direct requests: strings, so never one the SDK mints (ints)."""
_DIRECT_MARK = b'"' + DIRECT_ID_PREFIX.encode()
_LOG_MARK = b'"notifications/message"'
LogFn = Callable[[types.LoggingMessageNotificationParams], Awaitable[None]]
CANCEL_WRITE_TIMEOUT = 2.0
"""How long the courtesy `notifications/cancelled` of an abandoned request may take to write."""


class StderrTail:
    """Keeps the last `limit` bytes a child wrote to stderr and logs each line (redacted)."""

    __slots__ = (
        "_budget",
        "_buffer",
        "_ended",
        "_fed",
        "_limit",
        "_partial",
        "_redact",
        "_server",
    )

    def __init__(self, server: str, redact: Redactor, limit: int = STDERR_TAIL_BYTES) -> None:
        self._server = server
        self._redact = redact
        self._limit = limit
        self._buffer = bytearray()
        self._partial = bytearray()
        self._fed = 0
        self._ended: anyio.Event | None = None
        self._budget = LogBudget(server, "stderr", log)

    def mark(self) -> int:
        """How many bytes were fed so far: `since(mark)` later quotes what came after."""
        return self._fed

    def started(self) -> None:
        """A new child writes to this tail (`wait_ended` waits for its stderr to end)."""
        self._ended = anyio.Event()

    def ended(self) -> None:
        """The child's stderr reached its end (it exited or closed it)."""
        self._budget.flush()
        if self._ended is not None:
            self._ended.set()

    async def wait_ended(self, seconds: float) -> None:
        """Wait up to `seconds` for the current child's stderr to end: a crashing server
        writes its last words to stderr while its stdout is already closed."""
        if self._ended is not None:
            with anyio.move_on_after(seconds):
                await self._ended.wait()

    def since(self, mark: int, count: int = 8, max_chars: int = 800) -> str:
        """The last non-empty lines written after `mark` (see `last_lines`); empty if none."""
        new = self._fed - mark
        if new <= 0:
            return ""
        data = bytes(self._buffer[-new:]) if new < len(self._buffer) else bytes(self._buffer)
        return _last_lines(self._redact(data.decode("utf-8", "replace")), count, max_chars)

    def feed(self, chunk: bytes) -> None:
        self._fed += len(chunk)
        self._buffer += chunk
        if len(self._buffer) > self._limit:
            del self._buffer[: len(self._buffer) - self._limit]
        self._partial += chunk
        *lines, rest = self._partial.split(b"\n")
        for line in lines:
            self._log(line)
        if len(rest) > _STDERR_LINE_LIMIT:
            self._log(rest)
            rest = bytearray()
        self._partial = bytearray(rest)

    def flush(self) -> None:
        if self._partial:
            self._log(self._partial)
            self._partial = bytearray()

    def _log(self, line: bytes | bytearray) -> None:
        head = bytes(line[:_STDERR_LINE_LIMIT])
        if not head.strip() or not self._budget.allow(len(line)):
            return  # blank, or over the server's log budget (counted, summarised later)
        text = head.decode("utf-8", "replace").rstrip()
        log.info("[%s] %s", self._server, self._redact(text))

    def text(self) -> str:
        """Everything kept (at most `limit` bytes), decoded and redacted."""
        return self._redact(bytes(self._buffer).decode("utf-8", "replace"))

    def last_lines(self, count: int = 5, max_chars: int = 600) -> str:
        """The last few non-empty lines, for an error message; empty if there are none."""
        return _last_lines(self.text(), count, max_chars)


def _last_lines(text: str, count: int, max_chars: int) -> str:
    """The last `count` distinct runs of non-empty lines, a line repeated in a row shown once
    with its count (`line (x12)`), joined with " | " and cut to `max_chars` from the end."""
    runs: list[list[Any]] = []  # [line, times]
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if runs and runs[-1][0] == line:
            runs[-1][1] += 1
        else:
            runs.append([line, 1])
    joined = " | ".join(line if times == 1 else f"{line} (x{times})"
                        for line, times in runs[-count:])
    return joined if len(joined) <= max_chars else "..." + joined[-max_chars:]


class ConnectionLost(MCPError):
    """Our side saw the pipe end (`CONNECTION_CLOSED`): unlike a server's own error response
    with that code (-32000 is also what servers use for their errors), this is a lost
    transport."""

    def __init__(self) -> None:
        super().__init__(types.CONNECTION_CLOSED, "Connection closed")


class RequestTimedOut(MCPError):
    """Our `read_timeout` expired (`REQUEST_TIMEOUT`): unlike a server's own -32001 error."""

    def __init__(self, method: str) -> None:
        super().__init__(types.REQUEST_TIMEOUT, f"Request {method!r} timed out")


class DirectRequests:
    """Requests the bridge writes on the child's stdin itself; see the module docstring.

    Only the event loop's thread uses it. `request` returns the raw `result` object of the
    response (a dict) or raises `MCPError` like the SDK's `send_raw_request`: the server's
    error, `RequestTimedOut` after `read_timeout` (with a courtesy cancel), `ConnectionLost`
    when the pipe is gone or ends while waiting (both `MCPError`s with the SDK's codes, told
    apart from a server's error response of the same code by their class).
    """

    __slots__ = ("_broken", "_closed", "_last_notice", "_next", "_on_log", "_pending",
                 "_progress", "_stdin", "_tasks")

    def __init__(self, on_log: LogFn | None = None) -> None:
        self._pending: dict[str, asyncio.Future[dict[str, Any] | types.ErrorData]] = {}
        self._progress: dict[str, ProgressFnT] = {}
        self._on_log = on_log
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_notice: asyncio.Task[None] | None = None  # notices run one after another
        self._next = 0
        self._stdin: asyncio.StreamWriter | None = None
        self._broken: Callable[[], Awaitable[None]] | None = None
        self._closed = False

    def claims(self, line: bytes) -> bool:
        """Whether a line from stdout may concern a direct request (it names one of our ids;
        late answers included, so they are dropped here) or is a log message."""
        return (self._next > 0 and _DIRECT_MARK in line) or (
            self._on_log is not None and _LOG_MARK in line)

    def attach(self, stdin: asyncio.StreamWriter, broken: Callable[[], Awaitable[None]]) -> None:
        """The child's stdin, and what to do when writing to it fails (end the connection)."""
        self._stdin, self._broken = stdin, broken

    async def request(
        self,
        method: str,
        params: dict[str, Any],
        *,
        read_timeout: float,
        on_progress: ProgressFnT | None = None,
    ) -> dict[str, Any]:
        self._next += 1
        request_id = f"{DIRECT_ID_PREFIX}{self._next}"
        if on_progress is not None:
            params = {**params, "_meta": {**params.get("_meta", {}), "progressToken": request_id}}
            self._progress[request_id] = on_progress
        future: asyncio.Future[dict[str, Any] | types.ErrorData]
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        issued = False
        timer: asyncio.TimerHandle | None = None
        try:
            message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
            issued = True  # write() is synchronous: from here on the line is on its way
            await self._write(line)
            # The clock starts once the request is written, as in the SDK. A timer that
            # settles the future costs far less than a cancel scope per call.
            timer = asyncio.get_running_loop().call_later(read_timeout, _expire, future)
            outcome = await future
        except asyncio.CancelledError:
            if issued:
                await self._cancel(request_id, "caller cancelled", shield=True)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(request_id, None)
            self._progress.pop(request_id, None)
        if outcome is _EXPIRED:
            await self._cancel(request_id, f"timed out after {read_timeout}s", shield=False)
            raise RequestTimedOut(method)
        if outcome is _CLOSED:
            raise ConnectionLost()
        if isinstance(outcome, types.ErrorData):
            raise MCPError(outcome.code, outcome.message, outcome.data)
        return outcome

    def deliver(self, message: Any) -> bool:
        """Take a parsed message that answers a direct request or reports its progress; False
        leaves it to the SDK session."""
        if not isinstance(message, dict):
            return False
        if "method" in message:
            return self._on_progress(message) or self._on_log_message(message)
        request_id = message.get("id")
        if not (isinstance(request_id, str) and request_id.startswith(DIRECT_ID_PREFIX)):
            return False
        future = self._pending.get(request_id)
        if future is None or future.done():
            return True  # late (timed out or cancelled): dropped, as the SDK drops it
        result, error = message.get("result"), message.get("error")
        outcome: dict[str, Any] | types.ErrorData
        if isinstance(result, dict) and error is None:
            outcome = result
        elif isinstance(error, dict) and "result" not in message:
            try:
                outcome = types.ErrorData.model_validate(error, by_name=False)
            except ValidationError:
                outcome = types.ErrorData(
                    code=types.INTERNAL_ERROR, message="the server sent a malformed error")
        else:
            outcome = types.ErrorData(
                code=types.INTERNAL_ERROR, message="the server sent a malformed response")
        last = self._last_notice
        if last is None or last.done():
            future.set_result(outcome)
        else:  # after the notices read before it
            last.add_done_callback(lambda _: _settle(future, outcome))
        return True

    def fail(self, request_id: int | str | None, error: types.ErrorData) -> bool:
        """Answer a direct request with `error` (its response was refused); False if the id is
        not one of them."""
        future = self._pending.get(request_id) if isinstance(request_id, str) else None
        if future is None:
            return False
        if not future.done():
            future.set_result(error)
        return True

    def close(self) -> None:
        """The pipe ended: every waiter fails with CONNECTION_CLOSED, later requests at once."""
        self._closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_result(_CLOSED)

    def _on_progress(self, message: dict[str, Any]) -> bool:
        params = message.get("params")
        if message["method"] != "notifications/progress" or not isinstance(params, dict):
            return False
        token, progress = params.get("progressToken"), params.get("progress")
        callback = self._progress.get(token) if isinstance(token, str) else None
        if callback is None:
            return False
        if isinstance(progress, int | float) and not isinstance(progress, bool):
            total, text = params.get("total"), params.get("message")
            self._notice(callback(
                float(progress),
                float(total) if isinstance(total, int | float) else None,
                text if isinstance(text, str) else None,
            ))
        return True

    def _on_log_message(self, message: dict[str, Any]) -> bool:
        if self._on_log is None or message["method"] != "notifications/message":
            return False
        try:
            params = types.LoggingMessageNotificationParams.model_validate(
                message.get("params"), by_name=False)
        except ValidationError:
            return False  # the SDK's session reports it
        self._notice(self._on_log(params))
        return True

    def _notice(self, work: Awaitable[None]) -> None:
        """Run a notification's callback after the ones before it."""
        task = asyncio.get_running_loop().create_task(_after(self._last_notice, work))
        self._last_notice = task
        self._tasks.add(task)
        task.add_done_callback(self._notice_done)

    def _notice_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("a notification callback failed: %r", exc)

    async def _write(self, line: bytes) -> None:
        stdin = self._stdin
        if stdin is None or self._closed:
            raise ConnectionLost()
        try:
            stdin.write(line)
            await stdin.drain()
        except (OSError, RuntimeError):
            # The child is gone or stopped reading: end the connection so the supervisor sees it.
            self.close()
            if self._broken is not None:
                await self._broken()
            raise ConnectionLost() from None

    async def _cancel(self, request_id: str, reason: str, *, shield: bool) -> None:
        message = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": request_id, "reason": reason}}
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with anyio.move_on_after(CANCEL_WRITE_TIMEOUT, shield=shield) as scope, \
                contextlib.suppress(MCPError):
            await self._write(line)
        if scope.cancelled_caught:
            log.warning("courtesy cancel for request %r gave up: stdin is blocked", request_id)


_EXPIRED = types.ErrorData(code=types.REQUEST_TIMEOUT, message="no answer in time")
_CLOSED = types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed")


def _expire(future: asyncio.Future[dict[str, Any] | types.ErrorData]) -> None:
    _settle(future, _EXPIRED)


def _settle(
    future: asyncio.Future[dict[str, Any] | types.ErrorData],
    outcome: dict[str, Any] | types.ErrorData,
) -> None:
    if not future.done():
        future.set_result(outcome)


async def _after(previous: asyncio.Task[None] | None, work: Awaitable[None]) -> None:
    if previous is not None and not previous.done():
        await asyncio.wait((previous,))
    await work


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
    prestarted = PRESTARTED.claim(spec)
    if prestarted is not None:
        try:
            proc = await _Adopted.of(prestarted)
        except BaseException:  # claimed, so nobody else would stop it
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(stop_prestarted, prestarted)
            raise
        log.debug("[%s] adopted the server started before the daemon's imports (pid %d)",
                  server, proc.pid)
    else:
        proc = await asyncio.create_subprocess_exec(
            spec.command,
            *spec.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=spec.child_environment(),
            cwd=spec.cwd,
            start_new_session=True,
            limit=READ_CHUNK,
            preexec_fn=die_with_parent(),  # dies with the daemon (`bridges.child_groups`)
        )
    CHILD_GROUPS.add(proc.pid)  # reaped at the next start if the daemon dies first
    info.pid, info.returncode = proc.pid, None
    stderr.started()
    on_spawned()
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    direct = direct if direct is not None else DirectRequests()
    assert proc.stdin is not None
    direct.attach(proc.stdin, read_writer.aclose)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                _pump_stdout, proc, read_writer, spec.max_message_bytes, server, info, direct
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
) -> None:
    assert proc.stdout is not None
    framer = LineFramer(max_message_bytes, stream_at=STREAM_LINES_AT)
    try:
        while chunk := await proc.stdout.read(READ_CHUNK):
            framer.feed(chunk)
            del chunk
            for item in drain_messages(framer, direct.claims, direct.deliver):
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
        direct.close()
        await out.aclose()


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
    """Close stdin, wait `grace`, SIGTERM the group, wait, SIGKILL it; then sweep survivors."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError, RuntimeError):
            proc.stdin.close()
    pgid = proc.pid  # start_new_session: the child leads its own group
    if not await _exited(proc, grace):
        _signal_group(pgid, signal.SIGTERM)
        if not await _exited(proc, TERM_GRACE):
            _signal_group(pgid, signal.SIGKILL)
            await _exited(proc, TERM_GRACE)
    # A live group keeps its id from being reused, so signalling it here is safe.
    if _group_alive(pgid):
        _signal_group(pgid, signal.SIGTERM)
        for _ in range(int(TERM_GRACE / _POLL)):
            if not _group_alive(pgid):
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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


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
    async def of(cls, process: subprocess.Popen[bytes]) -> _Adopted:
        assert process.stdin is not None and process.stdout is not None
        assert process.stderr is not None
        loop = asyncio.get_running_loop()
        transports: list[asyncio.BaseTransport] = []

        async def reader(pipe: IO[bytes]) -> asyncio.StreamReader:
            stream = asyncio.StreamReader(limit=READ_CHUNK, loop=loop)  # as the spawned ones
            read, _ = await loop.connect_read_pipe(
                functools.partial(asyncio.StreamReaderProtocol, stream, loop=loop), pipe)
            transports.append(read)
            return stream

        try:
            stdout = await reader(process.stdout)
            stderr = await reader(process.stderr)
            write, protocol = await loop.connect_write_pipe(
                functools.partial(asyncio.streams.FlowControlMixin, loop=loop), process.stdin)
            transports.append(write)
        except BaseException:
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
