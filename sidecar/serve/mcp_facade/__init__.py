"""The MCP facade: the registry and the upstream servers as one MCP server.

    await serve_stdio(location)                       # `sidecar stdio`
    routes, lifespan = mcp_http(location)             # `/mcp` of `sidecar serve`
    build_app(location, token=..., extra_routes=routes, extra_lifespan=lifespan)

See `server` (the SDK route, and the facade's collaborators), `served` (the steps both routes
share), `fast_answers` (the requests answered without the SDK, and which), `stdio_fastpath` +
`stdio_pipes` and `http_fastpath` (the fast route on each transport), `relays` (upstream
servers' traffic to the sessions), `paused_calls` + `rounds` + `fleet_rounds` (2026-07-28
calls that need the client's input), `tools`, `upstream`, `sessions`, `profile_routes`,
`transports`. May import: the core, the face `bridges.mcp` (MCP types of the relayed
upstreams) and the rest of `sidecar.serve`.
"""

from sidecar.serve.mcp_facade.server import McpFacade
from sidecar.serve.mcp_facade.tools import AGENT_KEY, CALL_ID_KEY, MESSAGE_ID_KEY
from sidecar.serve.mcp_facade.transports import MCP_PATH, mcp_http, serve_stdio

__all__ = [
    "AGENT_KEY",
    "CALL_ID_KEY",
    "MCP_PATH",
    "MESSAGE_ID_KEY",
    "McpFacade",
    "mcp_http",
    "serve_stdio",
]
