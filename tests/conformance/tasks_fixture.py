"""The conformance suite's Tasks (SEP-2663) fixture contract as a Python MCP server: the fixed
tools of the 0.2.0 suite's `tasks-*` scenarios, listed with their `execution.taskSupport` and run
as plain calls (the sidecar's facade makes the tasks): `greet(name)` (sync only),
`slow_compute(seconds, label)`, `failing_job()` (required; isError), `protocol_error_job()` (a
JSON-RPC error), `confirm_delete()` (one elicitation), `multi_input()` (two at once),
`test_tool_with_task()` (required: an MRTR round for `user_name`, then a task of its own; it
needs 2026-07-28, so `--mrtr` serves it alone).

    python tasks_fixture.py                 # stdio
    python tasks_fixture.py --http          # 127.0.0.1, prints `PORT <n>`, serves /mcp
    python tasks_fixture.py --http --completion-asks   # also prompt `pick(choice)`, whose
        # completion/complete is answered with input_required (forbidden in 2026-07-28; sent raw)
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
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import ConfigDict

warnings.simplefilter("ignore")  # the SDK marks elicitation deprecated in 2026


def _tool(name: str, support: str | None, properties: dict[str, Any] | None = None
          ) -> types.Tool:
    execution = types.ToolExecution(task_support=support) if support else None
    return types.Tool(name=name, description=f"tasks fixture: {name}", execution=execution,
                      input_schema={"type": "object", "properties": properties or {}})


TOOLS = [
    _tool("greet", None, {"name": {"type": "string"}}),
    _tool("slow_compute", "optional", {"seconds": {"type": "number"},
                                       "label": {"type": "string"}}),
    _tool("failing_job", "required"),
    _tool("protocol_error_job", "optional"),
    _tool("confirm_delete", "optional"),
    _tool("multi_input", "optional"),
]
MRTR_TOOLS = [_tool("test_tool_with_task", "required")]
NAME_SCHEMA = {"type": "object", "properties": {"user_name": {"type": "string"}}}
CONFIRM_SCHEMA = {"type": "object", "properties": {"confirm": {"type": "boolean"}}}


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=MRTR_TOOLS if MRTR else TOOLS)


MRTR = "--mrtr" in sys.argv[1:]


def _text(value: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=value)], is_error=error)


async def _elicit(ctx: Any, message: str, schema: dict[str, Any]) -> Any:
    answer = await ctx.session.send_request(
        types.ElicitRequest(params=types.ElicitRequestFormParams(
            message=message, requested_schema=schema)),
        types.ElicitResult, metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
    return answer.content or {}


TASKS: dict[str, dict[str, Any]] = {}


def _task(text: str) -> Any:
    """A CreateTaskResult (SEP-2663) whose task has already completed with `text`."""
    stamp = "2026-12-06T00:00:00Z"
    task = {"taskId": f"fixture-{len(TASKS) + 1}", "status": "completed", "createdAt": stamp,
            "lastUpdatedAt": stamp, "ttlMs": 60000}
    TASKS[task["taskId"]] = {**task, "result": {"content": [{"type": "text", "text": text}]}}
    return {"resultType": "task", **task, "status": "working"}


class TaskParams(types.RequestParams):
    model_config = ConfigDict(extra="allow")
    taskId: str  # the wire name


async def get_task(ctx: Any, params: TaskParams) -> dict[str, Any]:
    task = TASKS.get(params.taskId)
    if task is None:
        raise MCPError(types.INVALID_PARAMS, f"unknown task {params.taskId!r}")
    return task


async def call_tool(
    ctx: Any, params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    args = params.arguments or {}
    name = params.name
    if MRTR and name == "test_tool_with_task":  # round 1 asks; round 2 carries the answer
        answer = (params.input_responses or {}).get("user_name")
        if answer is None:
            return types.InputRequiredResult(input_requests={"user_name": types.ElicitRequest(
                params=types.ElicitRequestFormParams(
                    message="What is your name?", requested_schema=NAME_SCHEMA))},
                request_state="asked-user_name")
        content = getattr(answer, "content", None) or {}
        return _task(f"Hello, {content.get('user_name', content.get('name'))}!")
    if name == "greet":
        return _text(f"Hello, {args.get('name', 'World')}!")
    if name == "slow_compute":
        await anyio.sleep(float(args.get("seconds", 0) or 0))
        return _text(f"computed {args.get('label', '')}")
    if name == "failing_job":
        await anyio.sleep(0.2)
        return _text("the job failed", error=True)
    if name == "protocol_error_job":
        raise MCPError(types.INTERNAL_ERROR, "the job crashed")
    if name == "confirm_delete":
        answer = await _elicit(ctx, "Delete the file?", CONFIRM_SCHEMA)
        return _text(f"confirmed: {answer.get('confirm')}")
    if name == "multi_input":
        answers: list[Any] = [None, None]

        async def ask(i: int) -> None:
            answers[i] = await _elicit(ctx, f"Input {i + 1}?", NAME_SCHEMA)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, 0)
            tg.start_soon(ask, 1)
        return _text(f"inputs: {answers}")
    raise MCPError(types.INVALID_PARAMS, f"unknown tool {name!r}")


PICK = types.Prompt(name="pick", description="tasks fixture: pick",
                    arguments=[types.PromptArgument(name="choice")])


async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[PICK])


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    choice = (params.arguments or {}).get("choice", "")
    return types.GetPromptResult(messages=[types.PromptMessage(
        role="user", content=types.TextContent(text=f"picked {choice}"))])


async def complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
    return types.CompleteResult(completion=types.Completion(values=["apple", "apricot"]))


ASKING = {"resultType": "input_required", "inputRequests": {"user_name": {
    "method": "elicitation/create",
    "params": {"mode": "form", "message": "Who is asking?", "requestedSchema": NAME_SCHEMA}}}}


def asking_completions(app: Any) -> Any:
    """`app`, except that a POSTed completion/complete gets `ASKING` as its result."""
    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if isinstance(request, dict) and request.get("method") == "completion/complete":
            reply = json.dumps({"jsonrpc": "2.0", "id": request.get("id"), "result": ASKING})
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": reply.encode()})
            return None
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await app(scope, replay, send)

    return wrapped


async def main() -> None:
    prompts: dict[str, Any] = {}
    if "--completion-asks" in sys.argv[1:]:
        prompts = {"on_list_prompts": list_prompts, "on_get_prompt": get_prompt,
                   "on_completion": complete}
    server: Server[Any] = Server("tasks-fixture", version="1.0.0",
                                 on_list_tools=list_tools, on_call_tool=call_tool, **prompts)
    server.add_request_handler("tasks/get", TaskParams, get_task)
    if "--http" in sys.argv[1:]:
        await _serve_http(server)
        return
    options = server.create_initialization_options(NotificationOptions())
    async with stdio_server() as (read, write):
        await server.run(read, write, options)


async def _serve_http(server: Server[Any]) -> None:
    import socket

    import uvicorn

    sock = socket.create_server(("127.0.0.1", 0))
    app = server.streamable_http_app(host="127.0.0.1")
    if "--completion-asks" in sys.argv[1:]:
        app = asking_completions(app)
    web = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                        timeout_graceful_shutdown=1))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await web.serve(sockets=[sock])


if __name__ == "__main__":
    anyio.run(main)
