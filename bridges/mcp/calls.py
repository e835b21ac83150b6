"""One tool call to an upstream server, from permission ask to mapped result.

    permission ask (when the pool has a gate)  ->  a live connection (waiting briefly while the
    server (re)starts)  ->  tools/call via send_request (timeouts.call; our cancellation is
    forwarded as notifications/cancelled by the SDK)  ->  result mapping (see `results`)

Progress notifications for the call and log notifications that arrive while it is the server's
only call in flight become `ctx.progress(...)` snapshots. Over stdio, a log notification
carries nothing that ties it to a request, so with several calls in flight it only reaches the
daemon log: a log line of one session's call is never shown to another's.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import mcp_types as types
from mcp.shared.exceptions import MCPError
from opentelemetry.trace import SpanKind
from pydantic import ValidationError

from bridges.manifest.loading import ServerConfig
from bridges.mcp.call_results import PlainResult
from bridges.mcp.catalog import UpstreamTool
from bridges.mcp.connection import Connection
from bridges.mcp.passthrough import CALLER_HEADERS, UPSTREAM_CALL, InflightCall
from bridges.mcp.per_user import caller_bearer, forwarded
from bridges.mcp.redact import Redactor
from bridges.mcp.results import (
    is_our_timeout,
    is_transport_loss,
    plain_error,
    plain_response,
    rpc_failure,
    tool_error,
    tool_response,
    transport_failure,
)
from sidecar.model import tracing
from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.permissions import PermissionGate, ask_permission
from sidecar.model.tool import CallContext

if TYPE_CHECKING:
    from bridges.mcp.per_user import UserConnections

InputRequestFnT = Callable[[InflightCall, Any], Awaitable[Any]]
"""Answers a request embedded in a 2026-07-28 `input_required` result of one call."""

_UNTRACED = contextlib.nullcontext()
RECONNECT_WAIT = 5.0
"""How long a call waits for a (re)starting server before it fails `upstream`."""
_LOG_TEXT_LIMIT = 2000


class CallProgress:
    """The progress snapshot of one call: the latest progress and the latest log line."""

    __slots__ = ("_ctx", "_redact", "_snapshot")

    def __init__(self, ctx: CallContext, server: str, tool: str, redact: Redactor) -> None:
        self._ctx = ctx
        self._redact = redact
        self._snapshot: dict[str, Any] = {"server": server, "tool": tool}

    @property
    def context(self) -> CallContext:
        return self._ctx

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self._snapshot["progress"] = progress
        if total is not None:
            self._snapshot["total"] = total
        if message is not None:
            self._snapshot["message"] = self._redact(message)
        self._ctx.progress(self._snapshot)

    def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        entry: dict[str, Any] = {"level": params.level, "message": log_text(params, self._redact)}
        if params.logger:
            entry["logger"] = params.logger
        self._snapshot["log"] = entry
        self._ctx.progress(self._snapshot)


def log_text(params: types.LoggingMessageNotificationParams, redact: Redactor) -> str:
    data = params.data
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
    text = redact(text)
    return text if len(text) <= _LOG_TEXT_LIMIT else text[:_LOG_TEXT_LIMIT] + "..."


class Caller:
    """The call path of one server. The supervisor owns it and keeps it pointed at the current
    connection; tool values hold it across reconnects."""

    def __init__(
        self,
        server: str,
        *,
        permissions: PermissionGate | None,
        current: Callable[[], tuple[ServerConfig, Connection | None]],
        wait_ready: Callable[[float], Awaitable[Connection | None]],
        not_connected: Callable[[], str],
        failure_detail: Callable[[int], Awaitable[str]],
        stderr_mark: Callable[[], int] = lambda: 0,
        record_latency: Callable[[float], None],
        input_request: InputRequestFnT | None = None,
        auth_hint: Callable[[], str | None] | None = None,
    ) -> None:
        self.server = server
        self.redact = Redactor()
        self._permissions = permissions
        self._current = current
        self._wait_ready = wait_ready
        self._not_connected = not_connected
        self._failure_detail = failure_detail
        self._stderr_mark = stderr_mark
        self._record_latency = record_latency
        self._input_request = input_request
        self._auth_hint = auth_hint
        """The OAuth login sentence while the server wants one (`bridges.mcp.oauth`)."""
        self.inflight: list[CallProgress] = []
        self.users: UserConnections | None = None
        """Set for a server with credentials per user or `forward_headers`: a call goes
        through its caller's own connection (`bridges.mcp.per_user`)."""

    async def __call__(self, tool: UpstreamTool, arguments: Any, ctx: CallContext) -> Any:
        config, _ = self._current()
        await ask_permission(
            self._permissions, ctx,
            metadata={"server": self.server, "tool": tool.name},
            default=tool.permission_default,
        )
        connection = await self._connection(tool.name, config)
        progress = CallProgress(ctx, self.server, tool.name, self.redact)
        self.inflight.append(progress)
        started = time.perf_counter()
        try:
            users = self.users
            caller = CALLER_HEADERS.get()
            headers = forwarded(config.forward_headers, caller)
            if users is None or not (users.per_user or headers):
                result = await self._send(connection, tool.name, arguments, config, progress)
            else:
                result = await users.call_with(
                    ctx.runner.owner, headers, tool.name, config,
                    lambda own, hint: self._send(own, tool.name, arguments, config, progress,
                                                 hint=hint),
                    subject=caller_bearer(caller))
        finally:
            self.inflight.remove(progress)
            self._record_latency((time.perf_counter() - started) * 1000)
        if isinstance(result, PlainResult):  # text blocks alone, read without a model
            if result.is_error:
                raise self._redacted(plain_error(result, server=self.server, tool=tool.name))
            return plain_response(result, has_output=tool.has_output)
        if result.is_error:
            raise self._redacted(tool_error(result, server=self.server, tool=tool.name))
        return tool_response(result, has_output=tool.has_output)

    def calls(self) -> list[InflightCall]:
        """The calls in flight on this server, oldest first."""
        return [
            InflightCall(p.context.runner.session_id, p.context.runner.call_id)
            for p in self.inflight
        ]

    def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        if len(self.inflight) == 1:
            self.inflight[0].on_log(params)

    async def _connection(self, tool: str, config: ServerConfig) -> Connection:
        _, connection = self._current()
        if connection is not None and not connection.lost.is_set():
            return connection
        connection = await self._wait_ready(min(RECONNECT_WAIT, config.timeouts.call))
        if connection is not None:
            return connection
        raise ToolFailure(
            f"MCP server {self.server!r} is not connected ({self._not_connected()}); "
            f"tool {tool!r} was not called",
            {"server": self.server, "tool": tool},
            kind=ErrorKind.UPSTREAM,
        )

    async def _send(
        self,
        connection: Connection,
        tool: str,
        arguments: Any,
        config: ServerConfig,
        progress: CallProgress,
        *,
        hint: Callable[[], str | None] | None = None,
    ) -> types.CallToolResult | PlainResult:
        timeout = config.timeouts.call
        relay = self._input_request
        call = InflightCall(progress.context.runner.session_id, progress.context.runner.call_id)
        mark = self._stderr_mark()  # a crash quotes what the server wrote after this

        async def answer(request: types.InputRequest) -> Any:
            # An input_required round names its call exactly: route to that call's client.
            if relay is None:
                return types.ErrorData(code=types.INVALID_REQUEST,
                                       message=f"{request.method} cannot be relayed")
            return await relay(call, request)

        sent_by = UPSTREAM_CALL.set(call)  # what the server asks on this call's stream
        try:
            traced = tracing.step(f"tools/call {tool}", SpanKind.CLIENT, {
                "mcp.method.name": "tools/call", "gen_ai.tool.name": tool,
                "sidecar.server": self.server,
            }) if tracing.enabled() else _UNTRACED  # (no name nor attributes built for nothing)
            with traced:
                return await connection.call(
                    tool, arguments, call_timeout=timeout, progress=progress.on_progress,
                    answer=answer,
                )
        except MCPError as exc:
            auth_hint = hint if hint is not None else self._auth_hint
            login = auth_hint() if auth_hint is not None else None
            if login is not None:
                raise ToolFailure(
                    f"MCP server {self.server!r}, tool {tool!r}: the server refused the call: "
                    f"{login}",
                    {"server": self.server, "tool": tool, "code": exc.code},
                    kind=ErrorKind.UPSTREAM,
                ) from None
            # A server's error response (any code) fails this call only; our side's loss of
            # the transport restarts the server.
            lost = is_transport_loss(exc, direct=connection.direct)
            detail = await self._failure_detail(mark) if lost else ""
            failure = rpc_failure(exc, server=self.server, tool=tool, timeout=timeout,
                                  detail=detail, lost=lost,
                                  timed_out=is_our_timeout(exc, direct=connection.direct))
            if lost and "max_result_bytes" not in failure.message:
                # Over HTTP a dropped stream does not always end the transport: reconnect.
                connection.lost.set()
            raise self._redacted(failure) from None
        except ValidationError as exc:
            raise self._redacted(transport_failure(
                ValueError(f"not a valid tools/call result: {exc.errors()[0]['msg']}"),
                server=self.server,
                tool=tool,
            )) from None
        except (httpx2.HTTPError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError,
                RuntimeError) as exc:
            connection.lost.set()
            raise self._redacted(transport_failure(exc, server=self.server, tool=tool)) from None
        finally:
            UPSTREAM_CALL.reset(sent_by)

    def _redacted(self, failure: ToolFailure) -> ToolFailure:
        message = self.redact(failure.message)
        if message == failure.message:
            return failure
        return ToolFailure(message, failure.metadata, kind=failure.kind)
