"""`DirectRequests`: tool calls (and log notifications) on an upstream stdio server without the
SDK's session: the request line is written on stdin here and the stdout pump hands the answer
straight back, as a plain dict, before any SDK parsing. It keeps the SDK's behaviour (ids,
progress tokens, timeouts with a courtesy `notifications/cancelled`, cancellation forwarded,
every waiter failed with CONNECTION_CLOSED when the pipe ends) without its machinery; why:
bridges/mcp/README.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from bridges.mcp.framing import OversizedLine
from sidecar.model.json_text import compact

log = logging.getLogger("bridges.mcp.stdio")

DIRECT_ID_PREFIX = "mcp-sidecar/"
"""Ids (and progress tokens) of direct requests: strings, so never one the SDK mints (ints)."""
_DIRECT_MARK = b'"' + DIRECT_ID_PREFIX.encode()
_LOG_MARK = b'"notifications/message"'
RESULT_TOO_LARGE = -32099
"""Our JSON-RPC error code for an answer over a size limit (server-error range)."""
LogFn = Callable[[types.LoggingMessageNotificationParams], Awaitable[None]]
CANCEL_WRITE_TIMEOUT = 2.0
"""How long the courtesy `notifications/cancelled` of an abandoned request may take to write."""


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

    __slots__ = ("_broken", "_closed", "_last_notice", "_limits", "_next", "_on_log",
                 "_pending", "_progress", "_stdin", "_tasks")

    def __init__(self, on_log: LogFn | None = None) -> None:
        self._pending: dict[str, asyncio.Future[dict[str, Any] | types.ErrorData]] = {}
        self._progress: dict[str, ProgressFnT] = {}
        self._limits: dict[str, tuple[int, str]] = {}  # id -> (max answer bytes, its key)
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
        max_answer: tuple[int, str] | None = None,
    ) -> dict[str, Any]:
        """`max_answer`: (bytes, the manifest key that sets them): a longer answer is refused
        unparsed (`refuse_large`) and this raises `MCPError` naming the key."""
        self._next += 1
        request_id = f"{DIRECT_ID_PREFIX}{self._next}"
        if max_answer is not None:
            self._limits[request_id] = max_answer
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
            line = (compact(message)
                    or json.dumps(message, separators=(",", ":")).encode()) + b"\n"
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
            self._limits.pop(request_id, None)
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
                code=types.INTERNAL_ERROR, message=(
                    "the server sent a malformed response: not a valid JSON-RPC response "
                    "(neither one result object nor one error)"))
        last = self._last_notice
        if last is None or last.done():
            future.set_result(outcome)
        else:  # after the notices read before it
            last.add_done_callback(lambda _: _settle(future, outcome))
        return True

    def refuse_large(self, line: OversizedLine, server: str) -> bool:
        """Fail the direct request a large line answers if the line is over that request's
        `max_answer` (True: refused, do not parse it)."""
        request_id = line.request_id()
        limit = self._limits.get(request_id) if isinstance(request_id, str) else None
        if limit is None or line.size <= limit[0]:
            return False
        most, key = limit
        message = (f"the server's answer is {line.size:,} bytes, over this server's {key} "
                   f"({most:,} bytes); raise {key} for this server to accept it")
        log.warning("[%s] %s", server, message)
        return self.fail(request_id, types.ErrorData(code=RESULT_TOO_LARGE, message=message))

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
