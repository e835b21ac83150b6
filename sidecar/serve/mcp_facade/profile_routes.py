"""`/mcp/{profile}`: one MCP endpoint per profile (`sidecar.registry.profiles`), next to `/mcp`.

Each profile gets its own `McpFacade` (its sessions, its listings, its `list_changed`) and its
own streamable-HTTP session manager, made on the first request that names the profile and
kept until the daemon stops. A name no manifest declares is answered 404 before anything is
made; a session whose profile a reload removed lists no tools.

Imports `sidecar.location` and the rest of `sidecar.serve`. Exports `ProfileEndpoints` and
`http_manager`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from anyio.abc import TaskStatus
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from sidecar.serve.mcp_facade.http_fastpath import HttpFastPath, guard_depth
from sidecar.serve.mcp_facade.server import McpFacade

if TYPE_CHECKING:
    from sidecar.location.location import Location

Manager = Callable[[McpFacade], StreamableHTTPSessionManager]


class ProfileEndpoints:
    """The ASGI app of `/mcp/{profile}`; `lifespan()` must be entered while serving."""

    def __init__(self, location: Location, manager: Manager) -> None:
        self.location = location
        self._manager = manager
        self._endpoints: dict[str, StreamableHTTPSessionManager] = {}
        self.facades: dict[str, McpFacade] = {}
        self._lock = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield
            finally:
                self._tg = None
                tg.cancel_scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = scope.get("path_params", {}).get("profile", "")
        if not self.location.profiles.exists(name):
            await _not_found(send, name, self.location.profiles.names())
            return
        manager = await self._endpoint(name)
        if manager is None:
            await _not_found(send, name, [])
            return
        await manager.handle_request(scope, receive, send)

    async def _endpoint(self, name: str) -> StreamableHTTPSessionManager | None:
        found = self._endpoints.get(name)
        if found is not None:
            return found
        async with self._lock:
            found = self._endpoints.get(name)
            if found is not None or self._tg is None:
                return found
            facade = McpFacade(self.location, profile=name)
            manager = self._manager(facade)
            await self._tg.start(self._serve, facade, manager)
            self.facades[name] = facade
            self._endpoints[name] = manager
            return manager

    @staticmethod
    async def _serve(
        facade: McpFacade, manager: StreamableHTTPSessionManager,
        *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with facade.attached(), manager.run():
            task_status.started()
            await anyio.sleep_forever()


def http_manager(facade: McpFacade) -> StreamableHTTPSessionManager:
    """The session manager of one facade, with the JSON fast path and the nesting limit
    installed."""
    from mcp.server.transport_security import TransportSecuritySettings

    manager = StreamableHTTPSessionManager(
        app=facade.server,
        stateless=False,
        json_response=False,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    HttpFastPath(facade).install(manager)
    guard_depth(manager)
    return manager


async def _not_found(send: Send, name: str, known: list[str]) -> None:
    message = f"no profile named {name!r}"
    if known:
        message += f"; known profiles: {', '.join(known)}"
    body = json.dumps({"error": {"code": "unknown_profile", "message": message}}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())
    ]
    await send({"type": "http.response.start", "status": 404, "headers": headers})
    await send({"type": "http.response.body", "body": body})
