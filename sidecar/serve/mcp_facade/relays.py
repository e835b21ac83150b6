"""Server-to-client traffic of upstream servers, relayed to the facade's downstream sessions.

`UpstreamRelay` is the facade's `bridges.mcp.RelayTarget` (attached to the pool's relay while
the facade serves; the routing rules are its docstring). It is given the facade's sessions,
subscription bus, upstream servers, the executions of 2026-07-28 calls (a request becomes an
`input_required` round) and the resource subscriptions. Exports `UpstreamRelay` and
`quietly`. May import the core, the face `bridges.mcp` and the rest of `sidecar.serve`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata

from bridges.mcp import INPUT_KEY, InflightCall
from sidecar.serve.mcp_facade import upstream
from sidecar.serve.mcp_facade.sessions import DownstreamCall, Sessions

if TYPE_CHECKING:
    from sidecar.serve.mcp_facade.rounds import Execution

log = logging.getLogger("sidecar.mcp")

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


class UpstreamRelay:
    """Relays upstream servers' requests and notifications (`bridges.mcp.passthrough`) to
    downstream sessions:

    - sampling, elicitation or roots requests. A 2026-07-28 upstream embeds them in an
      `input_required` result, which names its call exactly; so does a 2025-era request on the
      response stream of a call over streamable HTTP (`bridges.mcp.Relay` narrows `calls` to it).
      Any other 2025-era request names no call: it goes to the one downstream session with calls
      in flight on that server, and is refused with a JSON-RPC error when several sessions have
      (`roots/list` with no call in flight goes to the most recent handshake-era session with
      roots). A handshake-era client gets the request on the call's own stream; a 2026-07-28
      client gets an `input_required` result and continues the call by answering it (`rounds`;
      on any replica of a fleet: `fleet_rounds`).
    - log messages go to every session with a call in flight on that server (filtered by its
      `logging/setLevel`; 2026-07-28 sessions only when the request opted in); with no call in
      flight, to the handshake-era sessions that set a level.
    - a client's `notifications/roots/list_changed` is forwarded to every upstream server."""

    def __init__(
        self, sessions: Sessions, bus: InMemorySubscriptionBus, upstreams: upstream.Upstreams,
        running: Mapping[str, Execution], subscribers: Mapping[tuple[str, str], set[str]],
    ) -> None:
        self.sessions = sessions
        self.bus = bus
        self.upstreams = upstreams
        self._running = running
        """The executions of 2026-07-28 calls by call id (`paused_calls.PausedCalls`)."""
        self._subscribers = subscribers
        """Which sessions hold each (server, URI) subscription (the facade's handlers)."""
        # stdio: server-to-client requests go out through the transport wrapper (`fastpath`)
        self.requester: Callable[[Any, Any], Awaitable[Any]] | None = None
        self.notifier: Callable[[Any], Awaitable[None]] | None = None

    def owns(self, calls: Sequence[InflightCall]) -> bool:
        """Whether one of these calls came from one of this facade's sessions."""
        return any(inflight.call_id in self.sessions.calls for inflight in calls)

    def _callers(self, calls: Sequence[InflightCall]) -> list[DownstreamCall]:
        """The latest in-flight call of each downstream session with calls on a server."""
        latest: dict[str, DownstreamCall] = {}
        for inflight in calls:
            call = self.sessions.calls.get(inflight.call_id)
            if call is not None:
                latest[call.state.id] = call
        return list(latest.values())

    async def server_request(
        self, server: str, calls: Sequence[InflightCall], method: str, params: Any
    ) -> Any:
        callers = self._callers(calls)
        request_type, result_type, capability = _REQUESTS[method]
        request = request_type(params=params) if params is not None else request_type()
        if not callers and method == "roots/list":
            return await self._roots_outside_calls(server, request, capability)
        if len(callers) != 1:
            return types.ErrorData(code=types.INVALID_REQUEST, message=(
                f"{method} from MCP server {server!r} cannot be relayed: "
                + ("no client session has a call in flight on that server" if not callers else
                   f"{len(callers)} client sessions have calls in flight on that server, and a "
                   "2025-era request does not say which one it belongs to")))
        call = callers[0]
        if not call.session.check_client_capability(capability):
            return types.ErrorData(code=types.INVALID_REQUEST, message=(
                f"{method} from MCP server {server!r}: the client does not support it"))
        if call.state.modern:  # no server-to-client requests: an input_required round
            execution = self._running.get(call.call_id)
            if execution is None:
                return types.ErrorData(code=types.INVALID_REQUEST, message=(
                    f"{method} from MCP server {server!r}: the call is not running"))
            return await execution.ask(request, INPUT_KEY.get())
        try:
            if call.channel is not None:
                return await call.channel.request(request, result_type)
            if self.requester is not None:
                return await self.requester(request, result_type)
            return await call.session.send_request(
                request, result_type,
                metadata=ServerMessageMetadata(related_request_id=call.request_id),
            )
        except MCPError as exc:
            return types.ErrorData(code=exc.code, message=exc.message)

    async def _roots_outside_calls(self, server: str, request: Any, capability: Any) -> Any:
        """`roots/list` with no call in flight (servers ask at start and after a change): the
        most recent handshake-era session that has roots answers."""
        for state in reversed(self.sessions.live()):
            if not state.modern and state.session.check_client_capability(capability):
                try:
                    if self.requester is not None:
                        return await self.requester(request, types.ListRootsResult)
                    return await state.session.send_request(request, types.ListRootsResult)
                except MCPError as exc:
                    return types.ErrorData(code=exc.code, message=exc.message)
        return types.ErrorData(code=types.INVALID_REQUEST, message=(
            f"roots/list from MCP server {server!r}: no connected client has roots"))

    async def server_notification(
        self, server: str, calls: Sequence[InflightCall], notification: Any
    ) -> None:
        if isinstance(notification, types.LoggingMessageNotification):
            await self._relay_log(calls, notification)
        elif isinstance(notification, types.ResourceUpdatedNotification):
            await self._resource_updated(server, str(notification.params.uri))
        elif isinstance(notification, types.ResourceListChangedNotification):
            await self._broadcast(types.ResourceListChangedNotification(), ResourcesListChanged())
        elif isinstance(notification, types.PromptListChangedNotification):
            await self._broadcast(types.PromptListChangedNotification(), PromptsListChanged())
        elif isinstance(notification, types.ToolListChangedNotification):
            # a 2026-07-28 server's change, relayed even when the re-listing finds the same
            # tools (the registry then pushes nothing); 2025 sessions hear registry changes
            await self.bus.publish(ToolsListChanged())

    async def _relay_log(
        self, calls: Sequence[InflightCall], notification: types.LoggingMessageNotification
    ) -> None:
        """A log line goes to every session with a call in flight on that server (on that
        call's stream); with none, to the handshake-era sessions that set a log level."""
        level = notification.params.level
        callers = self._callers(calls)
        for call in callers:
            if not call.state.wants_log(level):
                continue
            scoped = call.state.modern or call.request_id is not None
            if call.channel is not None:
                await quietly(call.channel.notify(notification))
            elif not call.state.modern or _log_opted_in(call, level):
                await self.note(call.session, notification,
                                 call.request_id if scoped else None, modern=call.state.modern)
        if callers:
            return
        for state in self.sessions.live():
            if not state.modern and state.log_level is not None and state.wants_log(level):
                await self.note(state.session, notification)

    async def _resource_updated(self, server: str, uri: str) -> None:
        holders = self._subscribers.get((server, uri), set())
        up = self.upstreams.by_key(server)
        outward = up.uri_out(uri) if up is not None else uri
        for state in self.sessions.live():
            if state.id in holders and not state.modern:
                await self.note(state.session, types.ResourceUpdatedNotification(
                    params=types.ResourceUpdatedNotificationParams(uri=outward)))
        await self.bus.publish(ResourceUpdated(uri=outward))

    async def _broadcast(self, notification: Any, event: Any) -> None:
        for state in self.sessions.live():
            if not state.modern:
                await self.note(state.session, notification)
        await self.bus.publish(event)

    async def note(
        self, session: Any, notification: Any, related: types.RequestId | None = None, *,
        modern: bool = False,
    ) -> None:
        """A notification to a client; to a handshake-era client on stdio through the transport
        wrapper (the SDK's per-request sessions stop writing once their request is answered)."""
        if self.notifier is not None and not modern:
            await quietly(self.notifier(notification))
        else:
            await quietly(session.send_notification(notification, related_request_id=related))


def _log_opted_in(call: DownstreamCall, level: str) -> bool:
    allowed: frozenset[str] = getattr(call.session, "_allowed_log_levels", frozenset())
    return level in allowed


async def quietly(awaitable: Any) -> None:
    """A push to a client that may be gone: failures are logged, never raised."""
    try:
        await awaitable
    except Exception as exc:
        log.debug("could not notify an MCP client: %r", exc)
