"""The facade on its two transports: stdio (`serve_stdio`, `sidecar stdio`) and streamable
HTTP (`mcp_http`, `McpEndpoint`: `/mcp` and `/mcp/{profile}`). HTTP is stateful streamable
HTTP with SSE responses (progress and server-to-client requests ride the call's own stream;
`tools/list_changed` the session's GET stream). On both, the fast route (`fast_answers`) and
the SDK's route (`server`) give the same bytes. Security (bearer token, Host/Origin) is the
app's `SecurityMiddleware`: the SDK's own DNS-rebinding check is off so that one policy
applies to every route.

Imports `sidecar.location` and the rest of `sidecar.serve`. Exports `serve_stdio`,
`mcp_http`, `McpEndpoint` and `MCP_PATH`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from io import TextIOWrapper
from typing import TYPE_CHECKING, Any, BinaryIO

import anyio
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sidecar.serve.mcp_facade.http_fastpath import HttpFastPath, guard_depth
from sidecar.serve.mcp_facade.profile_routes import ProfileEndpoints, http_manager
from sidecar.serve.mcp_facade.server import McpFacade, new_session_id
from sidecar.serve.mcp_facade.server_card import card_routes
from sidecar.serve.mcp_facade.stdio_fastpath import FastCalls
from sidecar.serve.mcp_facade.stdio_pipes import pipe_wire, pipes_available

if TYPE_CHECKING:
    from sidecar.location.location import Location

MCP_PATH = "/mcp"


async def serve_stdio(
    location: Location, *, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None,
    profile: str | None = None, fds: tuple[int, int] | None = None,
) -> None:
    """Serve one MCP client on stdin/stdout until stdin closes. Nothing else is written to
    stdout: logs belong on stderr. One session id per call (`stdio-<hex>`). `profile`: the
    profile served (`sidecar.registry.profiles`; None: the default one).

    On pipes (how agents start MCP servers) the wire runs on the event loop
    (`stdio_pipes`); otherwise, or with explicit streams, on the SDK's threaded transport.
    `fds`: a client's own stdin and stdout (pipes or a socket), received by the daemon's local
    door; they are served the same way, and closed at the end."""
    facade = McpFacade(location, session_id=new_session_id(), profile=profile)
    if fds is not None or (stdin is None and stdout is None and pipes_available()):
        # Until `FastCalls` exists every message takes the SDK's path (the handshake does).
        calls: list[FastCalls] = []
        async with facade.attached(), pipe_wire(
            lambda value: bool(calls) and calls[0].take_raw(value),
            lambda: bool(calls) and calls[0].busy,
            fds=fds,
        ) as wire:
            options: Any = None  # made at `initialize`: what the upstreams offer then
            calls.append(FastCalls(facade, wire.read, wire.write, wire.send_line))
            facade.relay.requester, facade.relay.notifier = calls[0].request, calls[0].notify
            try:
                await facade.server.run(calls[0], wire.write, options)
            finally:
                await calls[0].close()
        return
    # Without explicit streams the SDK also points fds 0/1 away from the wire while serving,
    # so stray output of children cannot corrupt it.
    in_text = anyio.wrap_file(TextIOWrapper(stdin, encoding="utf-8")) if stdin else None
    out_text = (
        anyio.wrap_file(TextIOWrapper(stdout, encoding="utf-8", write_through=True))
        if stdout else None
    )
    async with facade.attached(), stdio_server(in_text, out_text) as (read, write):
        options = None  # made at `initialize`: what the upstreams offer then
        fast = FastCalls(facade, read, write)
        facade.relay.requester, facade.relay.notifier = fast.request, fast.notify
        try:
            await facade.server.run(fast, write, options)
        finally:
            await fast.close()


def mcp_http(location: Location) -> tuple[list[BaseRoute], AbstractAsyncContextManager[Any]]:
    """`(routes, lifespan)` for `build_app(extra_routes=routes, extra_lifespan=lifespan)`:
    `/mcp` serves the default profile, `/mcp/{profile}` each declared one
    (`profile_routes`)."""
    facade = McpFacade(location)
    manager = StreamableHTTPSessionManager(
        app=facade.server,
        stateless=False,
        json_response=False,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    fast_path = HttpFastPath(facade)
    fast_path.install(manager)
    profiles = ProfileEndpoints(location, http_manager)

    @asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        async with facade.attached(), manager.run(), profiles.lifespan():
            yield

    endpoint = McpEndpoint(manager, fast_path)
    routes: list[BaseRoute] = [
        Route(MCP_PATH, endpoint=endpoint, methods=["GET", "POST", "DELETE"]),
        # the cards before the profiles: `/mcp/server-card` is not a profile
        *card_routes(location, lambda: facade.server.get_capabilities().extensions or {},
                     facade.server.version),
        Route(MCP_PATH + "/{profile}", endpoint=profiles, methods=["GET", "POST", "DELETE"]),
    ]
    return routes, lifespan()


class McpEndpoint:
    """The ASGI app of `/mcp`: the SDK's session manager, with `fast_path` installed on it.

    A POST body nested deeper than `MAX_JSON_DEPTH` is answered 400 with a JSON-RPC parse
    error (`guard_depth`, as on `/mcp/NAME`)."""

    def __init__(self, manager: StreamableHTTPSessionManager, fast_path: HttpFastPath) -> None:
        self.manager = manager
        self.fast_path = fast_path
        guard_depth(manager)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.manager.asgi_app(scope, receive, send)

    def inner_middleware(self, app: ASGIApp) -> ASGIApp:
        """For `build_app`: the fast path's `shortcut` to this endpoint's sessions, put right
        inside the app's `SecurityMiddleware`."""
        return self.fast_path.shortcut(app, MCP_PATH)
