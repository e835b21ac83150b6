"""The upstream stdio MCP server of the side-by-side benchmarks (`bench/compare.py`).

    python bench/upstream.py [--tools N] [--http PORT]

`--http PORT`: the same server over streamable HTTP on 127.0.0.1:PORT (`/mcp`, the SDK's own
`streamable_http_app` under uvicorn with uvloop): the `direct streamable HTTP` row.

Written with the `mcp` 2.x lowlevel `Server` (no pydantic argument models: the cheapest
server the SDK offers, so that relay overheads show). Tools:

- `echo(text)`: returns `text` as one text item;
- `big(nbytes)`: returns one text item of `nbytes` bytes in 100-byte lines;
- `t000` ... (`--tools N`): N extra echo-like tools with a small object input schema, for the
  catalog-scale section.
"""

from __future__ import annotations

import argparse

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

LINE = b"0123456789" * 9 + b"abcdefghi\n"  # 100 bytes


def make_tools(extra: int) -> list[types.Tool]:
    tools = [
        types.Tool(
            name="echo", description="Echo the text back",
            input_schema={"type": "object", "properties": {"text": {"type": "string"}},
                          "required": ["text"]},
        ),
        types.Tool(
            name="big", description="Return nbytes of text",
            input_schema={"type": "object", "properties": {"nbytes": {"type": "integer"}},
                          "required": ["nbytes"]},
        ),
    ]
    tools.extend(
        types.Tool(
            name=f"t{i:03d}", description=f"Synthetic tool number {i}: echoes its input",
            input_schema={
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "what to echo"},
                    "count": {"type": "integer", "minimum": 0},
                },
                "required": ["text"],
            },
        )
        for i in range(extra)
    )
    return tools


def big_text(nbytes: int) -> str:
    whole, rest = divmod(nbytes, len(LINE))
    return (LINE * whole + LINE[:rest]).decode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=0, help="extra synthetic tools")
    parser.add_argument("--http", type=int, default=None, metavar="PORT",
                        help="serve streamable HTTP on 127.0.0.1:PORT instead of stdio")
    args = parser.parse_args()
    tools = make_tools(args.tools)
    listing = types.ListToolsResult(tools=tools)

    async def list_tools(ctx, params) -> types.ListToolsResult:  # type: ignore[no-untyped-def]
        return listing

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:  # type: ignore[no-untyped-def]
        arguments = params.arguments or {}
        if params.name == "big":
            text = big_text(int(arguments.get("nbytes", 0)))
        else:
            text = str(arguments.get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    server = Server("bench-upstream", version="1.0", on_list_tools=list_tools,
                    on_call_tool=call_tool)

    if args.http is not None:
        import uvicorn

        uvicorn.run(server.streamable_http_app(host="127.0.0.1"), host="127.0.0.1",
                    port=args.http, log_level="warning", access_log=False, loop="uvloop")
        return

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)


if __name__ == "__main__":
    main()
