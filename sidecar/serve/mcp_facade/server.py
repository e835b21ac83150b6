"""`McpFacade`: the Location's registry and upstream servers as one lowlevel MCP `Server`.

One facade serves any number of downstream sessions (stdio: one; HTTP: one per
`Mcp-Session-Id`), in both protocol eras. See `tools` (tool list/call and the `_meta` keys),
`upstream` (resources, prompts, completion, namespacing) and `sessions`.

Server-to-client traffic of upstream servers (`bridges.mcp.passthrough`): a sampling,
elicitation or roots request arrives with the calls in flight on that server; it goes to the
downstream session that made them (on the call's own stream) when exactly one session has calls
there and it declared the capability, else the upstream gets a JSON-RPC error. Log messages go to
that session too (filtered by its `logging/setLevel`; 2026-07-28 sessions get them only when the
request opted in). Progress: every `CallProgress` event of a call (from any tool, upstream
progress included) becomes `notifications/progress` when the client sent a `progressToken`.
"""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from bridges.mcp.passthrough import InflightCall
from sidecar.events import CallProgress, CallSettled
from sidecar.serve.mcp_facade import tools, upstream
from sidecar.serve.mcp_facade.sessions import DownstreamCall, Sessions
from sidecar.snapshot import Snapshot

if TYPE_CHECKING:
    from sidecar.daemon import Location

log = logging.getLogger("sidecar.mcp")

SERVER_NAME = "mcp-sidecar"
PROGRESS_DRAIN_SECONDS = 2.0
CHANGE_DEBOUNCE = 0.05
Ctx = ServerRequestContext[Any, Any]
_REQUESTS: dict[str, tuple[Any, Any, types.ClientCapabilities]] = {
    "sampling/createMessage": (
        types.CreateMessageRequest, types.CreateMessageResult,
        types.ClientCapabilities(sampling=types.SamplingCapability()),
    ),
    "elicitation/create": (
        types.ElicitRequest, types.ElicitResult,
        types.ClientCapabilities(elicitation=types.ElicitationCapability()),
    ),
    "roots/list": (
        types.ListRootsRequest, types.ListRootsResult,
        types.ClientCapabilities(roots=types.RootsCapability()),
    ),
}


class McpFacade:
    """Build with a Location; `server` is the SDK server to run on any transport. Use
    `async with facade.attached():` around serving so registry changes and upstream traffic
    reach the sessions."""

    def __init__(self, location: Location, *, session_id: str | None = None) -> None:
        self.location = location
        self.sessions = Sessions(session_id)
        self.bus = InMemorySubscriptionBus()
        self._snapshots: dict[str, Snapshot] = {}
        self._subscribers: dict[tuple[str, str], set[str]] = {}
        self.upstreams = upstream.Upstreams(
            lambda: location.sources.pool if location.sources is not None else None
        )
        with warnings.catch_warnings():  # logging/setLevel is deprecated in 2026-07-28 only
            warnings.simplefilter("ignore")
            self.server: Server[Any] = Server(
                SERVER_NAME,
                version="0.1.0",
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
                on_list_resources=self._list_resources,
                on_list_resource_templates=self._list_templates,
                on_read_resource=self._read_resource,
                on_subscribe_resource=self._subscribe,
                on_unsubscribe_resource=self._unsubscribe,
                on_list_prompts=self._list_prompts,
                on_get_prompt=self._get_prompt,
                on_completion=self._complete,
                on_set_logging_level=self._set_level,
                on_subscriptions_listen=ListenHandler(self.bus),
            )
        options = NotificationOptions(
            tools_changed=True, resources_changed=True, prompts_changed=True
        )
        original = self.server.create_initialization_options
        # The HTTP session manager calls it without arguments: advertise listChanged anyway.
        self.server.create_initialization_options = (  # type: ignore[method-assign]
            lambda *a, **k: original(options, *a[1:], **k)
        )

    # --- lifecycle -----------------------------------------------------------------------

    @asynccontextmanager
    async def attached(self) -> AsyncIterator[None]:
        """Follow registry changes and take the upstream relay while serving."""
        location = self.location
        self._changed = anyio.Event()
        unsubscribe = location.registry.on_change(lambda: self._changed.set())
        pool = location.sources.pool if location.sources is not None else None
        if pool is not None:
            pool.relay.target = self
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._push_changes)
                yield
                tg.cancel_scope.cancel()
        finally:
            if pool is not None and pool.relay.target is self:
                pool.relay.target = None
            unsubscribe()

    async def _push_changes(self) -> None:
        while True:
            await self._changed.wait()
            await anyio.sleep(CHANGE_DEBOUNCE)  # one push for a burst of changes
            self._changed = anyio.Event()
            for sid in list(self._snapshots):
                self._snapshots[sid] = self.location.snapshot(session_id=sid)
            for state in self.sessions.live():
                if not state.modern:
                    await _quietly(state.session.send_tool_list_changed())
            await self.bus.publish(ToolsListChanged())

    # --- tools ---------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        state = self.sessions.state(ctx)
        snapshot = self.location.snapshot(session_id=state.id)
        self._snapshots[state.id] = snapshot
        return tools.tool_list(snapshot, modern=_modern(ctx))

    async def _call_tool(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        state = self.sessions.state(ctx)
        snapshot = self._snapshots.get(state.id)
        if snapshot is None:
            snapshot = self._snapshots[state.id] = self.location.snapshot(session_id=state.id)
        meta: dict[str, Any] = dict(params.meta) if params.meta is not None else {}
        client = ctx.session.client_params
        try:
            context = tools.call_context(
                session_id=state.id, request_id=ctx.request_id, meta=meta,
                client_name=client.client_info.name if client is not None else None,
            )
        except ValueError as exc:
            return tools.error_result(str(exc))
        if context.call_id in self.sessions.calls:
            return tools.error_result(f"call id {context.call_id!r} is already in flight")
        token = meta.get("progress_token", meta.get("progressToken"))
        call = DownstreamCall(context.call_id, state, ctx.session, ctx.request_id,
                              token if isinstance(token, str | int) else None)
        self.sessions.calls[call.call_id] = call
        try:
            if call.progress_token is None:
                outcome = await snapshot.execute(params.name, params.arguments or {}, context)
            else:
                outcome = await self._execute_with_progress(snapshot, params, context, call)
        finally:
            del self.sessions.calls[call.call_id]
        return tools.call_result(outcome, snapshot, modern=_modern(ctx))

    async def _execute_with_progress(
        self, snapshot: Snapshot, params: types.CallToolRequestParams, context: Any,
        call: DownstreamCall,
    ) -> Any:
        settled = anyio.Event()
        async with self.location.events.subscribe() as sub, anyio.create_task_group() as tg:

            async def forward() -> None:
                step = 0.0
                while True:
                    event = await sub.next()
                    if isinstance(event, CallSettled) and event.call_id == call.call_id:
                        settled.set()
                        return
                    if not isinstance(event, CallProgress) or event.call_id != call.call_id:
                        continue
                    snap = event.snapshot
                    value = snap.get("progress")
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        if value <= step and step:
                            continue
                        step = float(value)
                        total = snap.get("total")
                        message = snap.get("message")
                    elif "log" in snap and "server" in snap:
                        continue  # an upstream log line: relayed as a log message
                    else:
                        step += 1
                        total, message = None, _compact(snap)
                    await _quietly(call.session.send_progress_notification(
                        call.progress_token,  # type: ignore[arg-type]
                        step,
                        total if isinstance(total, int | float) else None,
                        message if isinstance(message, str) else None,
                        related_request_id=str(call.request_id),
                    ))

            tg.start_soon(forward)
            outcome = await snapshot.execute(params.name, params.arguments or {}, context)
            with anyio.move_on_after(PROGRESS_DRAIN_SECONDS):
                await settled.wait()
            tg.cancel_scope.cancel()
        return outcome

    # --- resources, prompts, completion, logging -----------------------------------------

    async def _list_resources(self, ctx: Ctx, params: Any) -> types.ListResourcesResult:
        return await upstream.list_resources(self.upstreams)

    async def _list_templates(self, ctx: Ctx, params: Any) -> types.ListResourceTemplatesResult:
        return await upstream.list_templates(self.upstreams)

    async def _read_resource(
        self, ctx: Ctx, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        return await upstream.read_resource(self.upstreams, str(params.uri))

    async def _subscribe(self, ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        state = self.sessions.state(ctx)
        key = await upstream.subscribe(self.upstreams, str(params.uri), on=True)
        state.subscriptions.add(key)
        self._subscribers.setdefault(key, set()).add(state.id)
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: Ctx, params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        state = self.sessions.state(ctx)
        up, original = self.upstreams.resolve_uri(str(params.uri))
        key = (up.key, original)
        state.subscriptions.discard(key)
        holders = self._subscribers.get(key, set())
        holders.discard(state.id)
        if not holders:
            self._subscribers.pop(key, None)
            await upstream.subscribe(self.upstreams, str(params.uri), on=False)
        return types.EmptyResult()

    async def _list_prompts(self, ctx: Ctx, params: Any) -> types.ListPromptsResult:
        return await upstream.list_prompts(self.upstreams)

    async def _get_prompt(
        self, ctx: Ctx, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        return await upstream.get_prompt(self.upstreams, params)

    async def _complete(
        self, ctx: Ctx, params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        if not self.upstreams.all():
            return types.CompleteResult(completion=types.Completion(values=[]))
        return await upstream.complete(self.upstreams, params)

    async def _set_level(self, ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
        self.sessions.state(ctx).log_level = params.level
        return types.EmptyResult()

    # --- the upstream relay (bridges.mcp.passthrough.RelayTarget) ------------------------

    def _caller(self, calls: Sequence[InflightCall]) -> DownstreamCall | None:
        """The latest in-flight call of the one downstream session with calls on a server."""
        mine = [self.sessions.calls[c.call_id] for c in calls if c.call_id in self.sessions.calls]
        if not mine or len({c.state.id for c in mine}) != 1:
            return None
        return mine[-1]

    async def server_request(
        self, server: str, calls: Sequence[InflightCall], method: str, params: Any
    ) -> Any:
        call = self._caller(calls)
        request_type, result_type, capability = _REQUESTS[method]
        if call is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message=(
                f"{method} from MCP server {server!r} cannot be relayed: it is answered only "
                "while exactly one client session has a call in flight on that server"))
        if not call.session.check_client_capability(capability):
            return types.ErrorData(code=types.INVALID_REQUEST, message=(
                f"{method} from MCP server {server!r}: the client does not support it"))
        request = request_type(params=params) if params is not None else request_type()
        try:
            return await call.session.send_request(
                request, result_type,
                metadata=ServerMessageMetadata(related_request_id=call.request_id),
            )
        except MCPError as exc:
            return types.ErrorData(code=exc.code, message=exc.message)

    async def server_notification(
        self, server: str, calls: Sequence[InflightCall], notification: Any
    ) -> None:
        if isinstance(notification, types.LoggingMessageNotification):
            call = self._caller(calls)
            if call is not None and call.state.wants_log(notification.params.level):
                scoped = call.state.modern or call.request_id is not None
                if not call.state.modern or _log_opted_in(call, notification.params.level):
                    await _quietly(call.session.send_notification(
                        notification, related_request_id=call.request_id if scoped else None))
        elif isinstance(notification, types.ResourceUpdatedNotification):
            await self._resource_updated(server, str(notification.params.uri))
        elif isinstance(notification, types.ResourceListChangedNotification):
            await self._broadcast(types.ResourceListChangedNotification(), ResourcesListChanged())
        elif isinstance(notification, types.PromptListChangedNotification):
            await self._broadcast(types.PromptListChangedNotification(), PromptsListChanged())

    async def _resource_updated(self, server: str, uri: str) -> None:
        holders = self._subscribers.get((server, uri), set())
        up = self.upstreams.by_key(server)
        outward = up.uri_out(uri) if up is not None else uri
        for state in self.sessions.live():
            if state.id in holders and not state.modern:
                await _quietly(state.session.send_resource_updated(outward))
        await self.bus.publish(ResourceUpdated(uri=outward))

    async def _broadcast(self, notification: Any, event: Any) -> None:
        for state in self.sessions.live():
            if not state.modern:
                await _quietly(state.session.send_notification(notification))
        await self.bus.publish(event)


def _modern(ctx: Ctx) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _log_opted_in(call: DownstreamCall, level: str) -> bool:
    allowed: frozenset[str] = getattr(call.session, "_allowed_log_levels", frozenset())
    return level in allowed


def _compact(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


async def _quietly(awaitable: Any) -> None:
    """A push to a client that may be gone: failures are logged, never raised."""
    try:
        await awaitable
    except Exception as exc:
        log.debug("could not notify an MCP client: %r", exc)


def new_session_id() -> str:
    return f"stdio-{uuid.uuid4().hex}"
