"""The fast routes answer exactly as the SDK's route does (`fast_answers`).

Every request kind a fast route takes is sent once through the SDK's route and once through
each fast route, on a fresh Location each time, and the JSON-RPC response bytes are compared:
stdio (the SDK's streams, and our pipes' JSON lines) and /mcp (a JSON body against the SDK's
SSE event). Key order is the one difference allowed: the SDK writes an object's keys in its
model's field order, the fast routes in the order the result was built, and JSON gives key
order no meaning. So two answers must parse to the same value AND be made of the very same
bytes (the same multiset: reordering keys moves bytes, any other difference, in a value, an
escape, a number or spacing, changes them). Ids the managed store makes are the one value
masked (two Locations, two ids). A request kind the fast routes leave to the SDK is checked
to be left alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp.shared.memory import create_client_server_memory_streams
from mcp.shared.message import SessionMessage
from pydantic import BaseModel

from sidecar import Location, Tool, ToolFailure
from sidecar.serve.app import build_app
from sidecar.serve.mcp_facade import CALL_ID_KEY, MESSAGE_ID_KEY, mcp_http
from sidecar.serve.mcp_facade.server import McpFacade
from sidecar.serve.mcp_facade.stdio_fastpath import FastCalls
from sidecar.serve.mcp_facade.transports import McpEndpoint
from tests.live_server import live_server
from tests.serve.mcp_facade.conftest import TOKEN, local_tools

pytestmark = pytest.mark.anyio

VERSION = "2025-11-25"
CALL = 100  # the id of the request under test


class TextIn(BaseModel):
    text: str = ""


def contract_tools() -> dict[str, Tool]:
    async def fail(args: TextIn, ctx: object) -> str:
        raise ToolFailure(f"cannot do {args.text!r}")

    async def long(args: TextIn, ctx: object) -> str:
        return "".join(f"line {i}: {args.text}\n" for i in range(5000))

    async def plain(args: TextIn, ctx: object) -> str:
        return f"naïve {args.text} — 日本語 🙂"

    return {
        **local_tools(),
        "fail": Tool(description="Always fails", input=TextIn, execute=fail),
        "long": Tool(description="Too long for the context", input=TextIn, execute=long),
        "plain": Tool(description="Text without an output schema", input=TextIn,
                      execute=plain),
    }


# (label, method, params): each is answered on the fast routes
FAST_KINDS: list[tuple[str, str, dict[str, Any]]] = [
    ("list", "tools/list", {}),
    ("list-cursor", "tools/list", {"cursor": None}),
    ("call-structured", "tools/call", {"name": "echo", "arguments": {"text": "hi"}}),
    ("call-list-output", "tools/call", {"name": "numbers", "arguments": {"text": "x"}}),
    ("call-no-arguments", "tools/call", {"name": "plain"}),
    ("call-unicode", "tools/call", {"name": "plain", "arguments": {"text": "é\u2028x"}}),
    ("call-meta-ids", "tools/call", {
        "name": "echo", "arguments": {"text": "m"},
        "_meta": {CALL_ID_KEY: "fixed-call", MESSAGE_ID_KEY: "msg-1"}}),
    ("call-tool-failure", "tools/call", {"name": "fail", "arguments": {"text": "that"}}),
    ("call-invalid-input", "tools/call", {"name": "echo", "arguments": {"text": 5}}),
    ("call-unknown-tool", "tools/call", {"name": "nope", "arguments": {}}),
    ("call-bounded", "tools/call", {"name": "long", "arguments": {"text": "x" * 20}}),
]

# the ids the store makes for retained text differ between two Locations
_MANAGED_ID = re.compile(rb"m_[0-9A-Za-z_-]{8,}")


def _normal(data: bytes) -> bytes:
    return _MANAGED_ID.sub(b"m_ID", data)


def same_but_key_order(a: bytes, b: bytes) -> bool:
    """Whether two JSON messages differ at most in the order of their objects' keys."""
    return json.loads(a) == json.loads(b) and sorted(a) == sorted(b)


def test_only_key_order_may_differ() -> None:
    assert same_but_key_order(b'{"b":1,"a":"x y"}', b'{"a":"x y","b":1}')
    assert not same_but_key_order(rb'{"a":"\u00e9"}', '{"a":"é"}'.encode())  # an escape
    assert not same_but_key_order(b'{"a":1.0}', b'{"a":1}')
    assert not same_but_key_order(b'{"a": 1}', b'{"a":1}')


@asynccontextmanager
async def _location(tmp_path: Path, route: str) -> AsyncIterator[Location]:
    async with Location.open(tmp_path, state_dir=tmp_path / f"state-{route}",
                             durable=False, entry_point_plugins=False) as location:
        location.tools.register(contract_tools())
        yield location


def _request(request_id: int, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


HANDSHAKE = [
    _request(1, "initialize", {"protocolVersion": VERSION, "capabilities": {},
                               "clientInfo": {"name": "contract", "version": "1"}}),
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    _request(2, "tools/list", {}),  # the first listing: after it, calls may take a fast route
]


# --- stdio -----------------------------------------------------------------------------------


async def stdio_answer(location: Location, route: str, method: str,
                       params: dict[str, Any]) -> tuple[bytes, int]:
    """The response line to request `CALL` over stdio, and how many requests the fast route
    took. `route`: "sdk", "streams" (FastCalls on the SDK's streams) or "pipes" (FastCalls
    taking plain JSON and writing JSON lines, as `stdio_pipes` runs it)."""
    facade = McpFacade(location, session_id="contract")
    answers: dict[Any, bytes] = {}
    arrived = {request_id: anyio.Event() for request_id in (1, 2, CALL)}

    def note(line: bytes) -> None:
        value = json.loads(line)
        if "id" in value and "method" not in value:
            answers[value["id"]] = line
            arrived[value["id"]].set()

    async def send_line(line: bytes) -> None:
        note(line.rstrip(b"\n"))

    async with facade.attached(), create_client_server_memory_streams() as (
        (client_read, client_write), (read, write)
    ), anyio.create_task_group() as tg:
        fast: FastCalls | None = None
        options = facade.server.create_initialization_options()
        if route == "sdk":
            tg.start_soon(facade.server.run, read, write, options)
        else:
            fast = FastCalls(facade, read, write, send_line if route == "pipes" else None)
            facade.relay.requester, facade.relay.notifier = fast.request, fast.notify
            tg.start_soon(facade.server.run, fast, write, options)

        async def responses() -> None:
            async for item in client_read:
                if isinstance(item, SessionMessage):
                    note(item.message.model_dump_json(by_alias=True,
                                                      exclude_unset=True).encode())

        tg.start_soon(responses)
        for message in [*HANDSHAKE, _request(CALL, method, params)]:
            if fast is not None and route == "pipes" and fast.take_raw(message):
                continue
            parsed = types.jsonrpc_message_adapter.validate_python(message, by_name=False)
            await client_write.send(SessionMessage(parsed))
            if message.get("id") in (1, 2):  # the handshake in order
                with anyio.fail_after(30):  # a hang guard
                    await arrived[message["id"]].wait()
        with anyio.fail_after(30):
            await arrived[CALL].wait()
        handled = fast.handled if fast is not None else 0
        if fast is not None:
            await fast.close()
        tg.cancel_scope.cancel()
    return _normal(answers[CALL]), handled


@pytest.mark.parametrize(("label", "method", "params"), FAST_KINDS,
                         ids=[k[0] for k in FAST_KINDS])
async def test_stdio_fast_routes_answer_as_the_sdk_does(
    tmp_path: Path, label: str, method: str, params: dict[str, Any]
) -> None:
    answers = {}
    for route in ("sdk", "streams", "pipes"):
        async with _location(tmp_path, route) as location:
            answers[route] = await stdio_answer(location, route, method, params)
    sdk, _ = answers["sdk"]
    for route in ("streams", "pipes"):
        answer, handled = answers[route]
        assert handled == 1, (label, route)
        assert same_but_key_order(answer, sdk), (label, route, answer, sdk)


# --- /mcp ------------------------------------------------------------------------------------


def _message_bytes(response: httpx.Response) -> bytes:
    """The one JSON-RPC message of a JSON body or of an SSE stream, as sent."""
    if response.headers["content-type"].startswith("application/json"):
        return response.content
    data = [line[5:].strip() for line in response.content.splitlines()
            if line.startswith(b"data:") and line[5:].strip()]
    assert len(data) == 1, response.text
    return data[0]


async def http_answer(tmp_path: Path, route: str, method: str,
                      params: dict[str, Any]) -> tuple[bytes, str, int]:
    """The JSON-RPC response to request `CALL` on /mcp, its content type, and how many
    requests the fast route took. `route`: "sdk" (fast route off) or "fast"."""
    async with _location(tmp_path, route) as location:
        routes, lifespan = mcp_http(location)
        app = build_app(location, token=TOKEN, extra_routes=routes, extra_lifespan=lifespan)
        endpoint = routes[0].endpoint  # type: ignore[attr-defined]
        assert isinstance(endpoint, McpEndpoint)
        endpoint.fast_path.enabled = route == "fast"
        async with live_server(app) as port, httpx.AsyncClient(
            headers={"authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as http:
            url = f"http://127.0.0.1:{port}/mcp"
            headers = {"accept": "application/json, text/event-stream",
                       "content-type": "application/json"}
            post: Callable[[dict[str, Any]], Any] = lambda body: http.post(  # noqa: E731
                url, content=json.dumps(body).encode(), headers=headers)
            first = await post(HANDSHAKE[0])
            headers["mcp-session-id"] = first.headers["mcp-session-id"]
            headers["mcp-protocol-version"] = VERSION
            assert (await post(HANDSHAKE[1])).status_code == 202
            assert (await post(HANDSHAKE[2])).status_code == 200
            response = await post(_request(CALL, method, params))
            assert response.status_code == 200, response.text
            handled = endpoint.fast_path.handled
    return _normal(_message_bytes(response)), response.headers["content-type"], handled


@pytest.mark.parametrize(("label", "method", "params"), FAST_KINDS,
                         ids=[k[0] for k in FAST_KINDS])
async def test_mcp_fast_route_answers_as_the_sdk_does(
    tmp_path: Path, label: str, method: str, params: dict[str, Any]
) -> None:
    sdk, sdk_type, sdk_handled = await http_answer(tmp_path, "sdk", method, params)
    fast, fast_type, fast_handled = await http_answer(tmp_path, "fast", method, params)
    assert (sdk_type.split(";")[0], sdk_handled) == ("text/event-stream", 0)
    assert (fast_type.split(";")[0], fast_handled) == ("application/json", 1)
    assert same_but_key_order(fast, sdk), (label, fast, sdk)


# --- what the fast routes leave alone ---------------------------------------------------------

SDK_KINDS: list[tuple[str, str, dict[str, Any]]] = [
    ("call-with-progress", "tools/call", {"name": "echo", "arguments": {"text": "p"},
                                          "_meta": {"progressToken": 7}}),
    ("call-extra-params", "tools/call", {"name": "echo", "arguments": {"text": "p"},
                                         "task": {"ttl": 1000}}),
    ("call-malformed", "tools/call", {"name": 5}),
    ("list-resources", "resources/list", {}),
    ("list-prompts", "prompts/list", {}),
]


@pytest.mark.parametrize(("label", "method", "params"), SDK_KINDS,
                         ids=[k[0] for k in SDK_KINDS])
async def test_other_requests_take_the_sdk_route(
    tmp_path: Path, label: str, method: str, params: dict[str, Any]
) -> None:
    async with _location(tmp_path, "pipes") as location:
        _, handled = await stdio_answer(location, "pipes", method, params)
    assert handled == 0, label
