"""An MCP server (stdio, lowlevel SDK `Server`, both eras) that offers what its argument says,
for the tests of what the facade advertises and of its cache hints (`test_offered`).

    python offer_server.py '{"tool": "t", "tools": [50000, "public"],
                             "prompts": [60000, "public"], "resources": [30000, "public"],
                             "templates": [45000, "private"],
                             "completions": true, "logging": true}'

One tool always (`tool`, listed with the hints of `tools` when given); prompts, resources
(with subscribe), resource templates, completions and logging only when named; each listing
answers with the given `ttlMs` and `cacheScope` (2026-07-28 era; a handshake-era client sees
none).
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server

warnings.simplefilter("ignore")
OFFER: dict[str, Any] = json.loads(sys.argv[1])


def _hints(kind: str) -> dict[str, Any]:
    ttl, scope = OFFER[kind]
    return {"ttl_ms": ttl, "cache_scope": scope}


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool(
        name=OFFER["tool"], input_schema={"type": "object", "properties": {}})],
        **(_hints("tools") if "tools" in OFFER else {}))


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text="ok")])


async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[types.Prompt(name="greet")], **_hints("prompts"))


async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(
        resources=[types.Resource(uri="memo://one", name="one")], **_hints("resources"))


async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
        uri_template="memo://{id}", name="memo")], **_hints("templates"))


async def read_resource(ctx: Any, params: Any) -> types.ReadResourceResult:
    return types.ReadResourceResult(contents=[types.TextResourceContents(
        uri=str(params.uri), text="memo")])


async def subscribe(ctx: Any, params: Any) -> types.EmptyResult:
    return types.EmptyResult()


async def complete(ctx: Any, params: Any) -> types.CompleteResult:
    return types.CompleteResult(completion=types.Completion(values=["a"]))


async def set_level(ctx: Any, params: Any) -> types.EmptyResult:
    return types.EmptyResult()


def build_server() -> Server[Any]:
    handlers: dict[str, Any] = {"on_list_tools": list_tools, "on_call_tool": call_tool}
    if "prompts" in OFFER:
        handlers["on_list_prompts"] = list_prompts
    if "resources" in OFFER:
        handlers.update(on_list_resources=list_resources, on_read_resource=read_resource,
                        on_subscribe_resource=subscribe, on_unsubscribe_resource=subscribe)
    if "templates" in OFFER:
        handlers["on_list_resource_templates"] = list_templates
    if OFFER.get("completions"):
        handlers["on_completion"] = complete
    if OFFER.get("logging"):
        handlers["on_set_logging_level"] = set_level
    return Server("offers", version="1.0.0", **handlers)


async def main() -> None:
    server = build_server()
    options = server.create_initialization_options(
        NotificationOptions(prompts_changed=True, resources_changed=True))
    async with stdio_server() as (read, write):
        await server.run(read, write, options)


if __name__ == "__main__":
    anyio.run(main)
