"""A handshake-era MCP server (stdio) whose tool asks the client for a completion once per
question, for the fleet tests of paused 2026-07-28 `/mcp` calls:

    ask(questions: [str, ...], hold: path?, progress: int?, logs: int?)
        samples each question in turn, then reports `progress` steps (1..n of n, when the call
        has a progressToken) and sends `logs` log messages ("log 1".."log n", info), then
        waits until the file `hold` exists (when given); returns the answers joined by " | ",
        and appends them to RUNS_FILE (or "cancelled" when the call was cancelled)

    python asking_server.py RUNS_FILE
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import ServerMessageMetadata

warnings.simplefilter("ignore")  # the SDK marks sampling deprecated in 2026
RUNS = Path(sys.argv[1]) if len(sys.argv) > 1 else None

ASK = types.Tool(name="ask", description="Ask the client each question in turn", input_schema={
    "type": "object", "properties": {"questions": {"type": "array", "items": {"type": "string"}},
                                     "hold": {"type": "string"},
                                 "progress": {"type": "integer"},
                                 "logs": {"type": "integer"}},
    "required": ["questions"]})


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[ASK])


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    try:
        return await _ask(ctx, params)
    except anyio.get_cancelled_exc_class():
        _ran("cancelled")
        raise


def _ran(line: str) -> None:
    if RUNS is not None:
        with RUNS.open("a") as runs:
            runs.write(line + "\n")


async def _ask(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    answers = []
    arguments = params.arguments or {}
    for question in arguments.get("questions", []):
        request = types.CreateMessageRequest(params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user",
                                            content=types.TextContent(text=str(question)))],
            max_tokens=10))
        answer = await ctx.session.send_request(
            request, types.CreateMessageResult,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
        content = answer.content
        answers.append(content.text if isinstance(content, types.TextContent) else "?")
    steps = int(arguments.get("progress", 0))
    for step in range(1, steps + 1):
        await ctx.session.report_progress(step, steps, f"step {step}")
    for line in range(1, int(arguments.get("logs", 0)) + 1):
        await ctx.session.send_log_message("info", f"log {line}", logger="asking")
    hold = arguments.get("hold")
    while hold and not await anyio.Path(hold).exists():  # noqa: ASYNC110
        await anyio.sleep(0.05)
    _ran(" | ".join(answers))
    return types.CallToolResult(content=[types.TextContent(text=" | ".join(answers))])


async def main() -> None:
    server: Server[Any] = Server("asking", version="1.0.0", on_list_tools=list_tools,
                                 on_call_tool=call_tool)
    options = server.create_initialization_options(NotificationOptions())
    async with stdio_server() as (read, write):
        await server.run(read, write, options)


if __name__ == "__main__":
    anyio.run(main)
