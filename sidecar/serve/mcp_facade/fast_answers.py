"""Requests the MCP facade answers without the SDK, on both transports: `fast_request` decides
which (its docstring has the table), `FastAnswers` answers them with the steps the SDK route
takes (`served.ServedTools`) and the same wire result (checked byte for byte by
`tests/serve/mcp_facade/test_fast_answers_contract.py`). The rest is the bookkeeping both fast
transports (`stdio_fastpath`, `http_fastpath`) share: calls in flight (`InFlight`),
server-to-client requests (`Asks`), the encoded listing (`ListingJson`). Why: README.md.

Imports `sidecar.model`, `sidecar.stores` and the rest of `sidecar.serve`. Exports
`fast_request`, `FastAnswers`, `FastList`, `FastCall`, `InFlight`, `Asks`, `ListingJson`,
`plain_request`, `call_params`, `cancels`, `notification_message`, `json_bytes` and
`REQUEST_CANCELLED`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.methods import serialize_server_result

from sidecar.model import tracing
from sidecar.model.frozen import quick_init
from sidecar.model.json_text import compact
from sidecar.serve.listing_cache import ListingCache
from sidecar.serve.mcp_facade import tools
from sidecar.serve.mcp_facade.sessions import (
    CallChannel,
    DownstreamCall,
    Sessions,
    SessionState,
)
from sidecar.stores.database_down import database_label, unavailable_message

if TYPE_CHECKING:
    from sidecar.serve.mcp_facade.served import ServedTools


@dataclass(frozen=True, slots=True)
class FastList:
    state: SessionState


@quick_init  # built for every call
@dataclass(frozen=True, slots=True)
class FastCall:
    state: SessionState
    name: str
    arguments: dict[str, Any]
    meta: dict[str, Any]


def fast_request(
    session: Callable[[bool], SessionState | None], request_id: types.RequestId, method: str,
    params: dict[str, Any] | None, inflight: InFlight,
) -> FastList | FastCall | None:
    """What to answer without the SDK for one plain JSON-RPC request, or None (the SDK's
    route answers it). `session(listed)`: the transport's session, when it may take a fast
    route (`FastAnswers.session` / `http_session`).

        request                                   route
        ----------------------------------------  -------------------------------------------
        tools/list (params: `cursor` at most)     fast, once the session's handshake (2025 era)
                                                  is done: the listing cached per registry state
        tools/call, plain: name, arguments,       fast, once the session (2025 era) has listed
          `_meta` without `progressToken`         tools: `FastAnswers.call` (the seam)
        notifications/cancelled for a fast call   fast: the call is cancelled
        the client's answer to a server request   fast (HTTP: when a fast call is waiting on it)
          a fast call sent
        everything else: initialize, the first    the SDK, unchanged
          listing, other listings, resources,
          prompts, 2026-07-28 requests, calls
          with progress/tasks/round fields, a
          request id still in flight, malformed
          params
    """
    if method == "tools/list":
        state = session(False)
        if state is None or (params and set(params) - {"cursor"}):
            return None
        return FastList(state)
    if method != "tools/call":
        return None
    state = session(True)
    call = call_params(params) if state is not None else None
    if state is None or call is None or request_id in inflight.tasks:
        return None  # an id still in flight, reused: the SDK's route answers it
    return FastCall(state, *call)


class FastAnswers:
    """A facade's answers on the fast routes, given its sessions and what it serves (the
    steps of a call are `served`'s, as on the SDK route)."""

    def __init__(self, sessions: Sessions, served: ServedTools) -> None:
        self.sessions = sessions
        self._served = served
        self.wire_listings = ListingCache[dict[str, Any]](4)
        """`tools/list` results as sent, by protocol version and definitions."""
        # bound once: looked up on every call
        self._settled_snapshot = served.settled_snapshot
        self._app_tool = served.app_tool
        self._login_first = served.login_first
        self._result_wire = served.result_wire

    def session(self, *, listed: bool = True) -> SessionState | None:
        """The stdio session, when its requests may bypass the SDK's runner: handshake era and
        (for `tools/call`, `listed`) tools listed, so the session has a snapshot."""
        if not self.sessions.fixed:
            return None
        return self._fast(self.sessions.single(), listed)

    def http_session(self, header_id: str, *, listed: bool = True) -> SessionState | None:
        """`session` for the /mcp session with that `Mcp-Session-Id`."""
        return self._fast(self.sessions.find(f"mcp-{header_id}"), listed)

    def _fast(self, state: SessionState | None, listed: bool) -> SessionState | None:
        if state is None or state.modern or state.protocol_version is None:
            return None
        if listed and state.snapshot is None:
            return None
        return state

    def listing(self, state: SessionState) -> dict[str, Any]:
        """`McpFacade._list_tools` as the wire result the SDK's runner would send (the same
        dump and the same protocol-version sieve), cached per registry state and version."""
        served = self._served
        snapshot = state.snapshot = served.snapshot(state.id)
        version = state.protocol_version or "2025-11-25"

        def build() -> dict[str, Any]:
            listing = served.listing(snapshot, modern=False)
            dumped = listing.model_dump(by_alias=True, mode="json", exclude_none=True)
            return serialize_server_result("tools/list", version, dumped)

        result = self.wire_listings.get(version, snapshot.definitions, build)
        starting = served.starting()
        if starting:
            return {**result, "_meta": {**result.get("_meta", {}), tools.STARTING_KEY: starting}}
        return result

    async def call(
        self, state: SessionState, request_id: types.RequestId, name: str,
        arguments: dict[str, Any], meta: dict[str, Any], channel: CallChannel | None = None,
    ) -> dict[str, Any]:
        """`McpFacade._call_tool` for a plain handshake-era call, answered as the wire result;
        `channel`: where the call's server-to-client requests and logs go (stdio: the relay's
        `requester`)."""
        snapshot = state.snapshot
        assert snapshot is not None  # `session` (listed) said so
        if snapshot.entry(name) is None:
            snapshot = await self._settled_snapshot(state)
            name = self._app_tool(snapshot, name)  # an MCP App's View: its server's own name
        client = state.session.client_params
        try:
            context = tools.call_context(
                session_id=state.id, request_id=request_id, meta=meta,
                client_name=client.client_info.name if client is not None else None,
                owner=state.owner,
            )
        except ValueError as exc:
            return tools.error_wire(str(exc))
        if context.call_id in self.sessions.calls:
            return tools.error_wire(f"call id {context.call_id!r} is already in flight")
        call = DownstreamCall(context.call_id, state, state.session, request_id, None, channel)
        self.sessions.calls[call.call_id] = call
        try:
            await self._login_first(snapshot, name, call, arguments)
            with tracing.continued(meta):  # a client's `_meta.traceparent`
                outcome = await snapshot.execute(name, arguments, context)
        finally:
            del self.sessions.calls[call.call_id]
        return await self._result_wire(outcome, snapshot, modern=False)


# --- shared bookkeeping of the fast routes ----------------------------------------------


def plain_request(
    value: dict[str, Any],
) -> tuple[types.RequestId, str, dict[str, Any] | None] | None:
    """`(id, method, params)` of a JSON-RPC request as plain JSON, or None when it is not one
    (the SDK's path validates and answers anything else)."""
    method = value.get("method")
    request_id = value.get("id")
    params = value.get("params")
    if (
        value.get("jsonrpc") != "2.0" or not isinstance(method, str)
        or isinstance(request_id, bool) or not isinstance(request_id, int | str)
        or (params is not None and not isinstance(params, dict))
    ):
        return None
    return request_id, method, params


def call_params(
    params: Mapping[str, Any] | None,
) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """`(name, arguments, _meta)` of a plain handshake-era `tools/call`, or None when the call
    needs the SDK's path (progress, malformed params, inputResponses, requestState, tasks)."""
    if not isinstance(params, Mapping):
        return None
    name = params.get("name")
    arguments = params.get("arguments")
    meta = params.get("_meta")
    if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
        return None
    if meta is not None and (not isinstance(meta, dict) or "progressToken" in meta):
        return None
    if set(params) - {"name", "arguments", "_meta"}:
        return None
    return name, arguments or {}, meta or {}


def notification_message(notification: Any) -> types.JSONRPCNotification:
    """A typed server notification as the JSON-RPC message that carries it."""
    data = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
    return types.JSONRPCNotification(
        jsonrpc="2.0", method=data["method"], params=data.get("params"))


def cancels(value: dict[str, Any], inflight: InFlight) -> bool:
    """Whether a notification, as plain JSON, cancels one of `inflight`'s calls (and cancel
    it)."""
    return (value.get("jsonrpc") == "2.0" and value.get("method") == "notifications/cancelled"
            and inflight.cancel(value.get("params")))


class InFlight:
    """Fast-path calls in flight by request id, and those the client cancelled. A call's task
    is cancelled directly: an anyio cancel scope per call cost ~5 % of the facade's CPU."""

    __slots__ = ("cancelled", "database", "tasks")

    def __init__(self, database: Any = None) -> None:
        self.database = database  # the Location's fleet database check: names it in errors
        self.tasks: dict[types.RequestId, asyncio.Task[Any]] = {}
        self.cancelled: set[asyncio.Task[Any]] = set()

    def cancel(self, params: Any) -> bool:
        request_id = params.get("requestId") if isinstance(params, Mapping) else None
        task = self.tasks.get(request_id) if isinstance(request_id, int | str) else None
        if task is None:
            return False
        if task not in self.cancelled:
            self.cancelled.add(task)
            task.cancel("the client cancelled the request")
        return True

    async def run(
        self, request_id: types.RequestId, work: Awaitable[dict[str, Any]],
        fail: Callable[[types.RequestId, types.ErrorData], Awaitable[None]],
    ) -> dict[str, Any] | None:
        """Await a call registered in `tasks` under `request_id` (by the task running this).
        A call the client alone cancelled returns None after `fail(REQUEST_CANCELLED)`; any
        other cancellation propagates. A bug below the facade (the seam turns every tool
        failure into an outcome) gets `fail(INTERNAL_ERROR)`, the SDK runner's generic answer,
        so the client does not wait forever; then it is raised to be logged."""
        task = asyncio.current_task()
        try:
            return await work
        except asyncio.CancelledError:
            if task in self.cancelled and task is not None and task.uncancel() == 0:
                await fail(request_id, types.ErrorData(code=REQUEST_CANCELLED,
                                                       message="Request cancelled"))
                return None
            raise
        except Exception as exc:  # the fleet database down: an error naming it, not raised
            message = unavailable_message(exc, "the call could not be run",
                                          database_label(self.database))
            await fail(request_id, types.ErrorData(code=types.INTERNAL_ERROR,
                                                   message=message or "Internal error"))
            if message is None:
                raise
            return None
        finally:
            del self.tasks[request_id]
            self.cancelled.discard(task)


class Asks:
    """Server-to-client requests sent on behalf of calls, by id, until the client answers."""

    __slots__ = ("_count", "_open")

    def __init__(self) -> None:
        self._open: dict[str, _Answer] = {}
        self._count = 0

    def settle(self, message: types.JSONRPCResponse | types.JSONRPCError) -> bool:
        """Hand the client's answer to the request waiting for it; False when none is."""
        answer = self._open.get(str(message.id)) if message.id is not None else None
        if answer is None:
            return False
        answer.settle(message)
        return True

    def waits_for(self, request_id: Any) -> bool:
        return isinstance(request_id, int | str) and str(request_id) in self._open

    async def ask(
        self, request: Any, result_type: Any,
        send: Callable[[types.JSONRPCRequest], Awaitable[None]],
    ) -> Any:
        """Send `request` (a typed server request) with a fresh id and return the client's
        typed result; a JSON-RPC error answer raises `MCPError`."""
        self._count += 1
        request_id = f"sidecar-{self._count}"
        answer = _Answer()
        self._open[request_id] = answer
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        message = types.JSONRPCRequest(
            jsonrpc="2.0", id=request_id, method=data["method"], params=data.get("params"))
        try:
            await send(message)
            await answer.done.wait()
        finally:
            del self._open[request_id]
        reply = answer.message
        if isinstance(reply, types.JSONRPCError):
            raise MCPError.from_error_data(reply.error)
        assert isinstance(reply, types.JSONRPCResponse)
        return result_type.model_validate(reply.result, by_name=False)


class ListingJson:
    """A cached listing is the same object until the registry changes: its JSON is encoded
    once too (5,000 tools are a few MB; encoding them took longer than the rest of
    answering)."""

    __slots__ = ("_cached",)

    def __init__(self) -> None:
        self._cached: tuple[dict[str, Any], bytes] | None = None

    def response(self, request_id: types.RequestId, result: dict[str, Any]) -> bytes | None:
        """The JSON-RPC response with `result`, or None when it is not plain JSON."""
        cached = self._cached
        if cached is None or cached[0] is not result:
            encoded = json_bytes(result)
            if encoded is None:
                return None
            cached = self._cached = (result, encoded)
        head = json_bytes({"jsonrpc": "2.0", "id": request_id})
        assert head is not None  # an id is a str or an int
        return head[:-1] + b',"result":' + cached[1] + b"}"


def json_bytes(message: dict[str, Any]) -> bytes | None:
    """Compact JSON (no newline in it), or None when the value is not plain JSON (the model
    path serializes it)."""
    data = compact(message, allow_nan=False)
    if data is not None:
        return data
    try:
        return json.dumps(message, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode()
    except (TypeError, ValueError):  # includes UnicodeEncodeError (a lone surrogate)
        return None


REQUEST_CANCELLED = -32800  # what the SDK's streamable HTTP transport answers a cancelled call


class _Answer:
    __slots__ = ("done", "message")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.message: types.JSONRPCResponse | types.JSONRPCError | None = None

    def settle(self, message: types.JSONRPCResponse | types.JSONRPCError) -> None:
        self.message = message
        self.done.set()
