"""A hostile MCP server over streamable HTTP whose `tools/list` answer is huge: `HUGE_LIST_MB`
megabytes of JSON (the listing of `huge_list_server.py`), sent in 1 MiB pieces as one JSON
body (`HUGE_LIST_MODE=json`, with a Content-Length; `chunked`: without one) or as one
server-sent event (`sse`). Serves `/mcp` on 127.0.0.1 at the port given as argv[1]; with
`legacy`, the 2024 HTTP+SSE transport instead (GET `/sse`, POST `/messages`, every answer an
event of the GET stream)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).parent))
from huge_list_server import PIECE, listing

Send = Callable[[dict[str, Any]], Awaitable[None]]


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]],
                  pieces: bool = False) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if not pieces:
        await send({"type": "http.response.body", "body": body})
        return
    for start in range(0, len(body), PIECE):
        await send({"type": "http.response.body", "body": body[start : start + PIECE],
                    "more_body": True})
    await send({"type": "http.response.body", "body": b""})


_EVENTS: asyncio.Queue[bytes] = asyncio.Queue()


async def _legacy_stream(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "more_body": True,
                "body": b"event: endpoint\ndata: /messages\n\n"})
    while True:
        data = await _EVENTS.get()
        event = b"event: message\ndata: " + data + b"\n\n"
        for start in range(0, len(event), PIECE):
            await send({"type": "http.response.body", "body": event[start : start + PIECE],
                        "more_body": True})


async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
    if scope["type"] != "http":
        return
    legacy = os.environ.get("HUGE_LIST_MODE") == "legacy"
    if legacy and scope["method"] == "GET" and scope["path"] == "/sse":
        await _legacy_stream(send)
        return
    if scope["method"] != "POST":
        await _answer(send, 405, b"", [])
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body)
    if legacy:
        await _answer(send, 202, b"", [])
        if "id" in request:
            await _EVENTS.put(_answer_of(request))
        return
    if "id" not in request:
        await _answer(send, 202, b"", [])
        return
    rid, method = request["id"], request["method"]
    session = [(b"mcp-session-id", b"huge-http")]
    if method == "initialize":
        answer = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "huge-list-http", "version": "1"}}}).encode()
        await _answer(send, 200, answer, [(b"content-type", b"application/json"), *session])
        return
    if method != "tools/list":
        answer = json.dumps({"jsonrpc": "2.0", "id": rid, "error": {
            "code": -32601, "message": f"no method {method}"}}).encode()
        await _answer(send, 200, answer, [(b"content-type", b"application/json"), *session])
        return
    data = listing(rid, float(os.environ.get("HUGE_LIST_MB", "3"))).rstrip(b"\n")
    mode = os.environ.get("HUGE_LIST_MODE", "json")
    if mode == "sse":
        event = b"event: message\ndata: " + data + b"\n\n"
        await _answer(send, 200, event, [(b"content-type", b"text/event-stream"), *session],
                      pieces=True)
        return
    headers = [(b"content-type", b"application/json"), *session]
    if mode == "json":
        headers.append((b"content-length", str(len(data)).encode()))
    await _answer(send, 200, data, headers, pieces=True)


def _answer_of(request: dict[str, Any]) -> bytes:
    rid, method = request["id"], request["method"]
    if method == "initialize":
        return json.dumps({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "huge-list-http", "version": "1"}}}).encode()
    if method == "tools/list":
        return listing(rid, float(os.environ.get("HUGE_LIST_MB", "3"))).rstrip(b"\n")
    return json.dumps({"jsonrpc": "2.0", "id": rid, "error": {
        "code": -32601, "message": f"no method {method}"}}).encode()


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
