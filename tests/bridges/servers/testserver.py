"""An MCP server for the bridge tests, written with the `mcp` 2.x lowlevel `Server`.

    python testserver.py [--transport stdio|http|sse] [--events FILE] [options]

Over http/sse it binds 127.0.0.1 on a free port and prints `PORT <n>` on stdout once it
listens. `--events FILE` appends one JSON object per line for what a test wants to observe
(start, ready, a handler cancelled, ...). Every handshake-era session and every 2026-era
`subscriptions/listen` stream hears `list_changed` when the tool set changes.

Tools: echo, add (structured), structured_only, bad_output, media, big, big_structured,
big_resource, many_links, slow, crash, fail, rpc_error, progress, mutate (adds/removes tools),
with `--leaky` leak / leak_structured (fake secrets) and remember (records its text),
and with options: `broken` (an invalid inputSchema), `t000`... (`--extra-tools N`), tools of
`--named-tool`, pages of `--page-size`, descriptions read from `--descriptions FILE` at each
listing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _early_start_event() -> None:
    # Written before the SDK is imported (that takes most of a second), so that a test can
    # see when each process was spawned.
    if "--events" in sys.argv:
        path = sys.argv[sys.argv.index("--events") + 1]
        with open(path, "a") as f:
            f.write(json.dumps({"event": "spawned", "pid": os.getpid(), "t": time.time()}) + "\n")


_early_start_event()

import base64  # noqa: E402
import socket  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import anyio  # noqa: E402
import mcp_types as types  # noqa: E402
from mcp.server import NotificationOptions, Server  # noqa: E402
from mcp.server.subscriptions import (  # noqa: E402
    InMemorySubscriptionBus,
    ListenHandler,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError  # noqa: E402

warnings.simplefilter("ignore")  # deprecation notes about logging would only clutter stderr

ARGS: argparse.Namespace
SESSIONS: list[Any] = []
BUS = InMemorySubscriptionBus()
TINY_PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)).decode()


def event(name: str, **fields: Any) -> None:
    if ARGS.events:
        with open(ARGS.events, "a") as f:
            f.write(json.dumps({"event": name, "pid": os.getpid(), "t": time.time(), **fields}))
            f.write("\n")


def obj(
    properties: dict[str, Any] | None = None, required: list[str] | None = None
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties or {}}
    if required:
        schema["required"] = required
    return schema


SUM_SCHEMA = obj({"sum": {"type": "integer"}}, ["sum"])
TOOLS: dict[str, types.Tool] = {
    "echo": types.Tool(
        name="echo", title="Echo", description="Echo the text back",
        input_schema=obj({"text": {"type": "string"}}, ["text"]),
        annotations=types.ToolAnnotations(read_only_hint=True),
        _meta={"vendor/x": 1},
    ),
    "add": types.Tool(
        name="add", description="Add two integers",
        input_schema=obj({"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
        output_schema=SUM_SCHEMA,
    ),
    "structured_only": types.Tool(
        name="structured_only", description="Structured content, no content blocks",
        input_schema=obj({"x": {"type": "integer"}}), output_schema=SUM_SCHEMA,
    ),
    "bad_output": types.Tool(
        name="bad_output", description="Structured content that breaks its own schema",
        input_schema=obj(), output_schema=SUM_SCHEMA,
    ),
    "plain_structured": types.Tool(
        name="plain_structured", description="Structured content without an output schema",
        input_schema=obj(),
    ),
    "media": types.Tool(name="media", description="One block of each kind", input_schema=obj()),
    "big": types.Tool(
        name="big", description="A large text result",
        input_schema=obj({"bytes": {"type": "integer"}, "line": {"type": "integer"}}, ["bytes"]),
    ),
    "big_structured": types.Tool(
        name="big_structured", description="A file read: text + the same as structuredContent",
        input_schema=obj({"bytes": {"type": "integer"}}, ["bytes"]),
        output_schema={"type": "object", "properties": {"content": {"type": "string"}},
                       "required": ["content"]},
    ),
    "big_resource": types.Tool(
        name="big_resource", description="A large embedded text resource",
        input_schema=obj({"bytes": {"type": "integer"}}, ["bytes"]),
    ),
    "many_links": types.Tool(
        name="many_links", description="Many resource links",
        input_schema=obj({"count": {"type": "integer"}}, ["count"]),
    ),
    "slow": types.Tool(
        name="slow", description="Sleep, reporting progress",
        input_schema=obj({"seconds": {"type": "number"}, "tag": {"type": "string"}}),
    ),
    "crash": types.Tool(
        name="crash", description="Exit the process mid-call",
        input_schema=obj({"stdout_first": {"type": "boolean"}, "quietly": {"type": "boolean"}}),
        annotations=types.ToolAnnotations(destructive_hint=True),
    ),
    "fail": types.Tool(name="fail", description="isError result", input_schema=obj()),
    "rpc_error": types.Tool(
        name="rpc_error", description="A JSON-RPC error (of `code`, when given)",
        input_schema=obj({"code": {"type": "integer"}}),
    ),
    "progress": types.Tool(
        name="progress", description="Progress and log notifications",
        input_schema=obj({"steps": {"type": "integer"}}),
        annotations=types.ToolAnnotations(open_world_hint=True, read_only_hint=True),
    ),
    "mutate": types.Tool(
        name="mutate", description="Add and remove tools, then notify list_changed",
        input_schema=obj({
            "add": {"type": "array", "items": {"type": "string"}},
            "remove": {"type": "array", "items": {"type": "string"}},
        }),
    ),
}


LEAKY_TOOLS: dict[str, types.Tool] = {
    "leak": types.Tool(
        name="leak", description="Text holding a fake secret (aws, private_key, or big: `bytes` "
        "of text with the AWS key in the middle)",
        input_schema=obj({"kind": {"type": "string"}, "bytes": {"type": "integer"}}, ["kind"]),
    ),
    "leak_structured": types.Tool(
        name="leak_structured", description="A fake AWS key as text and structuredContent",
        input_schema=obj(), output_schema=obj({"key": {"type": "string"}}, ["key"]),
    ),
    "remember": types.Tool(
        name="remember", description="Record the text it received (event `remembered`)",
        input_schema=obj({"text": {"type": "string"}}, ["text"]),
    ),
}
"""With `--leaky`: tools for the guardrail tests."""


def configure_tools() -> None:
    if ARGS.leaky:
        TOOLS.update(LEAKY_TOOLS)
    if ARGS.invalid_schema:
        TOOLS["broken"] = types.Tool(
            name="broken", description="Its input schema is not a schema",
            input_schema={"type": "object", "properties": {"x": {"type": "no-such-type"}}},
        )
    for i in range(ARGS.extra_tools):
        name = f"t{i:03d}"
        TOOLS[name] = types.Tool(name=name, description=f"extra tool {i}", input_schema=obj())
    for name in ARGS.named_tool:
        TOOLS[name] = types.Tool(name=name, description=f"named tool {name}",
                                 input_schema={"type": "object"})


async def list_tools(
    ctx: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    if ctx.session not in SESSIONS:
        SESSIONS.append(ctx.session)
    if ARGS.descriptions:
        for tool_name, change in (await anyio.to_thread.run_sync(read_descriptions)).items():
            if tool_name in TOOLS:  # a description, or {"description": ..., "input_schema": ...}
                update = change if isinstance(change, dict) else {"description": change}
                TOOLS[tool_name] = TOOLS[tool_name].model_copy(update=update)
    names = sorted(TOOLS)
    start = int(params.cursor) if params is not None and params.cursor else 0
    size = ARGS.page_size or len(names) or 1
    end = start + size
    cursor = str(end) if end < len(names) else None
    if ARGS.repeat_cursor and cursor is not None:
        cursor = str(size)  # a broken paginator: page 2 forever
    return types.ListToolsResult(tools=[TOOLS[n] for n in names[start:end]], next_cursor=cursor)


def read_descriptions() -> dict[str, str | dict[str, Any]]:
    try:
        with open(ARGS.descriptions) as f:
            found: dict[str, str | dict[str, Any]] = json.load(f)
            return found
    except FileNotFoundError:
        return {}


def text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=value)])


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    name = params.name
    event("call", tool=name, meta=dict(params.meta or {}))
    if name in ARGS.named_tool:
        return text(f"upstream {name}")
    if name == "echo":
        return text(args["text"])
    if name == "add":
        total = args["a"] + args["b"]
        return types.CallToolResult(
            content=[types.TextContent(text=f"{total}")], structured_content={"sum": total}
        )
    if name == "structured_only":
        return types.CallToolResult(content=[], structured_content={"sum": args.get("x", 0)})
    if name == "bad_output":
        return types.CallToolResult(content=[], structured_content={"sum": "not a number"})
    if name == "plain_structured":
        return types.CallToolResult(content=[], structured_content={"answer": 42})
    if name == "media":
        return types.CallToolResult(content=[
            types.TextContent(text="caption"),
            types.ImageContent(data=TINY_PNG, mime_type="image/png"),
            types.AudioContent(data=base64.b64encode(b"RIFF").decode(), mime_type="audio/wav"),
            types.EmbeddedResource(resource=types.TextResourceContents(
                uri="test://doc", mime_type="text/plain", text="embedded text")),
            types.EmbeddedResource(resource=types.BlobResourceContents(
                uri="test://bin", mime_type="application/octet-stream",
                blob=base64.b64encode(b"\x00\x01").decode())),
            types.ResourceLink(uri="test://link", name="link", description="a link",
                               mime_type="text/plain"),
        ])
    if name == "big":
        return text(make_text(args["bytes"], args.get("line", 100)))
    if name == "big_structured":
        body = make_text(args["bytes"], 100)
        return types.CallToolResult(content=[types.TextContent(text=body)],
                                    structured_content={"content": body})
    if name == "big_resource":
        return types.CallToolResult(content=[
            types.TextContent(text="the file:"),
            types.EmbeddedResource(resource=types.TextResourceContents(
                uri="test://big.txt", mime_type="text/plain",
                text=make_text(args["bytes"], 100))),
        ])
    if name == "many_links":
        return types.CallToolResult(content=[
            types.ResourceLink(uri=f"test://file/{i}", name=f"file {i}",
                               description="a linked file", mime_type="text/plain")
            for i in range(args["count"])
        ])
    if name == "slow":
        return await slow(ctx, float(args.get("seconds", 30)), str(args.get("tag", "")))
    if name == "crash":
        if args.get("stdout_first"):  # as a runtime dying with a traceback: stdout ends first
            os.close(1)
            await anyio.sleep(0.3)
            print("Traceback (most recent call last): boom at the crash", file=sys.stderr,
                  flush=True)
            os._exit(3)
        if args.get("quietly"):  # killed from outside: no last words at all
            os.kill(os.getpid(), 9)
        print("about to crash", file=sys.stderr, flush=True)
        os._exit(3)
    if name == "fail":
        return types.CallToolResult(content=[types.TextContent(text="it failed")], is_error=True)
    if name == "rpc_error" and "code" in args:
        raise MCPError(int(args["code"]), f"server error {args['code']}: the database is locked")
    if name == "rpc_error":
        raise RuntimeError("boom from the server")
    if name == "progress":
        steps = int(args.get("steps", 3))
        for i in range(steps):
            await ctx.session.report_progress(i + 1, steps, f"step {i + 1}")
            await ctx.session.send_log_message("info", f"log line {i + 1}", logger="testserver")
            await anyio.sleep(0.02)
        return text("done")
    if name == "leak":
        return text(leaked(str(args["kind"]), int(args.get("bytes", 0))))
    if name == "leak_structured":
        return types.CallToolResult(content=[types.TextContent(text=f"key {FAKE_AWS_KEY}")],
                                    structured_content={"key": FAKE_AWS_KEY})
    if name == "remember":
        event("remembered", text=args["text"])
        return text("remembered")
    if name == "mutate":
        for new in args.get("add", []):
            TOOLS[new] = types.Tool(name=new, description=f"added {new}", input_schema=obj())
        for old in args.get("remove", []):
            TOOLS.pop(old, None)
        await notify_changed()
        return text("mutated")
    if name in TOOLS:  # an extra or added tool
        return text(f"{name} ran")
    return types.CallToolResult(content=[types.TextContent(text=f"no tool {name}")], is_error=True)


FAKE_AWS_KEY = "AKIAIOSFODNN7EXAMPLE"  # AWS's documented example key id
FAKE_PRIVATE_KEY = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAfakefakefakefakefake\n"
                    "bm90IGEgcmVhbCBrZXkgYXQgYWxs\n-----END RSA PRIVATE KEY-----")


def leaked(kind: str, size: int) -> str:
    if kind == "aws":
        return f"config:\naws_access_key_id = {FAKE_AWS_KEY}\nregion = eu-west-1"
    if kind == "private_key":
        return f"id_rsa:\n{FAKE_PRIVATE_KEY}\n(end of file)"
    half = make_text(max(size // 2, 0), 100)
    return f"{half}\nkey {FAKE_AWS_KEY}\n{half}"


def make_text(size: int, line: int) -> str:
    unit = ("x" * (max(line, 2) - 1)) + "\n"
    body = unit * (size // len(unit))
    return body + "y" * (size - len(body))


async def slow(ctx: Any, seconds: float, tag: str) -> types.CallToolResult:
    event("slow-start", tag=tag)
    try:
        steps = max(1, int(seconds / 0.1))
        for i in range(steps):
            await ctx.session.report_progress(i + 1, steps, None)
            await anyio.sleep(seconds / steps)
    except anyio.get_cancelled_exc_class():
        event("cancelled", tag=tag)
        raise
    event("slow-done", tag=tag)
    return text(f"slept {seconds}")


async def notify_changed() -> None:
    for session in list(SESSIONS):
        try:
            await session.send_tool_list_changed()
        except Exception:
            SESSIONS.remove(session)
    await BUS.publish(ToolsListChanged())


def build_server() -> Server[Any]:
    server: Server[Any] = Server(
        "bridge-test", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool,
        on_subscriptions_listen=ListenHandler(BUS),
    )
    original = server.create_initialization_options
    server.create_initialization_options = (  # type: ignore[method-assign]
        lambda *a, **k: original(NotificationOptions(tools_changed=True))
    )
    return server


def bound_socket() -> socket.socket:
    """A socket on a free port of 127.0.0.1 that already listens: a client that connects as
    soon as `PORT` is printed waits in the backlog until uvicorn accepts (bound alone, the
    connection was refused until uvicorn's start-up had run: a test failed so under load)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


async def serve_http(server: Server[Any], app: Any) -> None:
    import uvicorn

    sock = bound_socket()
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    web = uvicorn.Server(config)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await web.serve(sockets=[sock])


def sse_app(server: Server[Any]) -> Any:
    from mcp.server.sse import SseServerTransport
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Mount, Route

    transport = SseServerTransport("/messages/")

    async def handle_sse(request: Any) -> Response:
        async with transport.connect_sse(request.scope, request.receive, request._send) as (r, w):
            await server.run(r, w, server.create_initialization_options())
        return Response()

    return Starlette(routes=[
        Route("/sse", endpoint=handle_sse, methods=["GET"]),
        Mount("/messages/", app=transport.handle_post_message),
    ])


async def main() -> None:
    event("start")
    if ARGS.secret_env:
        print(f"starting with {ARGS.secret_env}={os.environ.get(ARGS.secret_env)}",
              file=sys.stderr, flush=True)
    if ARGS.exit_at_start is not None:
        print("cannot start: exiting on purpose", file=sys.stderr, flush=True)
        sys.exit(ARGS.exit_at_start)
    if ARGS.hang_at_start:
        await anyio.sleep_forever()
    await anyio.sleep(ARGS.startup_delay)
    configure_tools()
    server = build_server()
    event("ready")
    if ARGS.transport == "stdio":
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    elif ARGS.transport == "http":
        await serve_http(server, server.streamable_http_app(host="127.0.0.1"))
    else:
        await serve_http(server, sse_app(server))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--transport", choices=["stdio", "http", "sse"], default="stdio")
    p.add_argument("--events")
    p.add_argument("--page-size", type=int, default=0)
    p.add_argument("--repeat-cursor", action="store_true")
    p.add_argument("--extra-tools", type=int, default=0)
    p.add_argument("--leaky", action="store_true", help="add leak, leak_structured, remember")
    p.add_argument("--named-tool", action="append", default=[],
                   help="also offer a tool of this name (it answers 'upstream <name>')")
    p.add_argument("--invalid-schema", action="store_true")
    p.add_argument("--startup-delay", type=float, default=0.0)
    p.add_argument("--hang-at-start", action="store_true")
    p.add_argument("--exit-at-start", type=int)
    p.add_argument("--secret-env")
    p.add_argument("--descriptions", help="a JSON file {tool: description} read at each "
                   "tools/list (tests of definition pinning)")
    return p.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()
    anyio.run(main)
