"""A small MCP Apps server (SEP-1865) for the facade tests, on stdio (lowlevel SDK `Server`).

Its View is served at `ui://get-time/mcp-app.html`, the same URI as the published
`@modelcontextprotocol/server-basic-vanillajs`, so two servers behind one gateway share a `ui://`
URI. Tools:

- `chart`: no `outputSchema`, returns `structuredContent` (the data a View renders) and names
  the View in `_meta.ui.resourceUri` and the older `_meta["ui/resourceUri"]`;
- `ui_declared`: whether the client (the gateway) declared `io.modelcontextprotocol/ui`.

    python apps_server.py
"""

from __future__ import annotations

import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

warnings.simplefilter("ignore")

UI = "io.modelcontextprotocol/ui"
MIME = "text/html;profile=mcp-app"
VIEW = "ui://get-time/mcp-app.html"
PAGE = "<!doctype html><html><body><p id=chart>charts view</p></body></html>"
OBJ: dict[str, Any] = {"type": "object", "properties": {}}


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[
        types.Tool(name="chart", description="A chart of three points", input_schema=OBJ,
                   _meta={"ui": {"resourceUri": VIEW}, "ui/resourceUri": VIEW}),
        types.Tool(name="ui_declared", description="Whether the client declared MCP Apps",
                   input_schema=OBJ),
    ])


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    if params.name == "chart":
        points = [{"x": 1, "y": 2}, {"x": 2, "y": 3}, {"x": 3, "y": 5}]
        return types.CallToolResult(content=[types.TextContent(text="3 points")],
                                    structured_content={"points": points})
    client = ctx.session.client_params
    extensions = (client.capabilities.extensions or {}) if client is not None else {}
    settings = extensions.get(UI)
    return types.CallToolResult(content=[types.TextContent(text=repr(settings))])


async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[
        types.Resource(uri=VIEW, name="chart-view", mime_type=MIME)])


async def read_resource(
    ctx: Any, params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    return types.ReadResourceResult(contents=[
        types.TextResourceContents(uri=str(params.uri), mime_type=MIME, text=PAGE)])


async def main() -> None:
    server: Server[Any] = Server("charts", version="1.0.0", on_list_tools=list_tools,
                                 on_call_tool=call_tool, on_list_resources=list_resources,
                                 on_read_resource=read_resource)
    server.extensions[UI] = {}
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
