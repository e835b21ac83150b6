"""Downstream MCP sessions and the calls they have in flight (`Sessions`).

The SDK hands each request a `ServerSession` that is a per-request proxy; what identifies a
client connection is the connection behind it (stdio: the process's one connection; HTTP: one
per `Mcp-Session-Id`). `Sessions` gives each connection a stable id, keeps the latest request
proxy of each handshake-era session (for pushes such as `tools/list_changed`) and the calls in
flight (for routing upstream requests, logs and progress back to the caller).

Imports `sidecar.execution` and `sidecar.serve.security`. Exports `Sessions`, `SessionState`,
`DownstreamCall`, `CallChannel` and `LOG_LEVELS`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from sidecar.execution.snapshot import Snapshot
from sidecar.model.frozen import quick_init
from sidecar.serve.security import token_owner

LOG_LEVELS: tuple[str, ...] = (
    "debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"
)


@dataclass(slots=True)
class SessionState:
    """One downstream client connection."""

    id: str
    session: ServerSession
    modern: bool
    log_level: str | None = None
    subscriptions: set[tuple[str, str]] = field(default_factory=set)
    protocol_version: str | None = None  # of its latest request
    # what it calls tools through: taken by its tools/list (or first call), refreshed on
    # registry changes; it lives exactly as long as the session
    snapshot: Snapshot | None = None
    # who its calls' retained text counts against: the scoped token of its latest HTTP request
    # ("token:<id>"), None for the all-access token or stdio (the session itself)
    owner: str | None = None

    def wants_log(self, level: str) -> bool:
        if self.log_level is None or level not in LOG_LEVELS:
            return True
        return LOG_LEVELS.index(level) >= LOG_LEVELS.index(self.log_level)


class CallChannel(Protocol):
    """A call's own way back to its client, when it has one outside the SDK's session (a
    fast-path call on /mcp: its POST's response)."""

    async def request(self, request: Any, result_type: Any) -> Any: ...

    async def notify(self, notification: Any) -> None: ...


@quick_init  # built for every call
@dataclass(frozen=True, slots=True)
class DownstreamCall:
    """One `tools/call` in flight: where its server-to-client traffic goes."""

    call_id: str
    state: SessionState
    session: ServerSession
    request_id: types.RequestId | None
    progress_token: str | int | None
    channel: CallChannel | None = None


class Sessions:
    """Every live downstream session, by connection, and every call in flight, by call id.

    A session is forgotten when its connection's `exit_stack` unwinds (the SDK's hook for
    per-connection cleanup: the end of a stdio or HTTP session, of each 2026-07-28 HTTP
    request). Weak references could not do it: a state holds its latest request proxy, which
    holds the connection, so every session ever served stayed "live" and was refreshed on every
    registry change."""

    def __init__(self, fixed_id: str | None = None) -> None:
        self._fixed_id = fixed_id
        self._by_connection: dict[Any, SessionState] = {}
        self.calls: dict[str, DownstreamCall] = {}
        self._by_id: dict[str, SessionState] = {}
        self.on_end: Callable[[SessionState], None] | None = None
        """Told of each session that ends (its resource subscriptions are let go)."""

    def state(self, ctx: ServerRequestContext[Any, Any]) -> SessionState:
        """The session of a request (created on its first request)."""
        # The per-request proxy holds the connection privately; it is the one stable identity.
        connection = getattr(ctx.session, "_connection", ctx.session)
        state = self._by_connection.get(connection)
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        if state is None:
            state = SessionState(self._new_id(ctx), ctx.session, modern)
            state.protocol_version = ctx.protocol_version
            self._by_connection[connection] = state
            self._by_id[state.id] = state
            stack = getattr(connection, "exit_stack", None)
            if stack is not None:
                stack.callback(self._ended, connection)
        else:
            state.session = ctx.session
            state.modern = modern
            state.protocol_version = ctx.protocol_version
        state.owner = token_owner(getattr(ctx.request, "scope", None))
        return state

    def _ended(self, connection: Any) -> None:
        state = self._by_connection.pop(connection, None)
        if state is not None:
            self._by_id.pop(state.id, None)
            if self.on_end is not None:
                self.on_end(state)

    @property
    def fixed(self) -> bool:
        """One connection for the facade's life (stdio)."""
        return self._fixed_id is not None

    def live(self) -> list[SessionState]:
        return list(self._by_connection.values())

    def find(self, session_id: str) -> SessionState | None:
        """A live session by its id."""
        return self._by_id.get(session_id)

    def single(self) -> SessionState | None:
        """The only live session, or None when there are none or several."""
        if len(self._by_connection) != 1:
            return None
        return next(iter(self._by_connection.values()))

    def _new_id(self, ctx: ServerRequestContext[Any, Any]) -> str:
        if self._fixed_id is not None:
            return self._fixed_id
        request = ctx.request
        headers = getattr(request, "headers", None)
        if headers is not None:
            given = headers.get("mcp-session-id")
            if given:
                return f"mcp-{given}"
        return f"mcp-{uuid.uuid4().hex}"
