"""The MCP facade: the registry and the upstream servers as one MCP server, on stdio and `/mcp`
(its modules, and which route a request takes: README.md).

    await serve_stdio(location)                       # `sidecar stdio`
    routes, lifespan = mcp_http(location)             # `/mcp` of `sidecar serve`
    build_app(location, token=..., extra_routes=routes, extra_lifespan=lifespan)

May import: the core, the face `bridges.mcp` (MCP types of the relayed upstreams) and the rest
of `sidecar.serve`. Exports `McpFacade`, `serve_stdio`, `mcp_http`, `MCP_PATH` and the `_meta`
keys `CALL_ID_KEY`, `MESSAGE_ID_KEY` and `AGENT_KEY`.
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
