"""A bare JSON-RPC line server for the direct-request tests: it answers `tools/call` by the
tool's name with exactly the bytes a misbehaving or slow server might send.

    echo       -> a text result                 error     -> a JSON-RPC error
    malformed  -> a result that is not an object progress  -> two progress notifications, then
    late       -> answers after 0.5 s              a result
    stranger   -> progress with a token nobody gave, then a result
    logs       -> two log messages, then a result
    die        -> exits with status 3 without answering
    error32001 -> a JSON-RPC error with code -32001 (what SDK clients use for their timeouts)
    bad_result -> a result object that is not a valid CallToolResult
    not_jsonrpc-> an object with the request's id and neither `result` nor `error`
    hold       -> answered only after a later `release` call (a call in flight meanwhile)

It also answers the 2025 handshake (`initialize`, `tools/list` of the names above,
`logging/setLevel`, `ping`), so a `ServerPool` can drive it with `protocol = "legacy"`;
`--bad-list` makes its `tools/list` result invalid (`{"tools": "nope"}`), `--odd-list` its
answer no JSON-RPC message at all (no `jsonrpc`, no `result`).

Every notification it receives is written to stderr as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


TOOLS = ("echo", "error", "error32001", "malformed", "bad_result", "not_jsonrpc", "hold",
         "release", "late", "die")


def handshake(rid: object, method: str, params: dict) -> bool:
    """Answer a request that is not a tool call; False for a tool call."""
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "1"}}})
    elif method == "tools/list":
        tools = [{"name": n, "inputSchema": {"type": "object"}} for n in TOOLS]
        if "--odd-list" in sys.argv:  # valid JSON, not JSON-RPC
            send({"id": rid, "tools": tools})
        else:
            send({"jsonrpc": "2.0", "id": rid,
                  "result": {"tools": "nope"} if "--bad-list" in sys.argv else {"tools": tools}})
    elif method in ("logging/setLevel", "ping"):
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    elif method != "tools/call" and method:
        send({"jsonrpc": "2.0", "id": rid,
              "error": {"code": -32601, "message": f"Method not found: {method}"}})
    else:
        return False
    return True


def main() -> None:
    held: list[object] = []
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            sys.stderr.write(json.dumps(message) + "\n")
            sys.stderr.flush()
            continue
        rid, params = message["id"], message.get("params") or {}
        if handshake(rid, message.get("method", ""), params):
            continue
        name = params.get("name")
        token = (params.get("_meta") or {}).get("progressToken")
        text = {"content": [{"type": "text", "text": json.dumps(params.get("arguments"))}]}
        if name == "echo":
            send({"jsonrpc": "2.0", "id": rid, "result": text})
        elif name == "error":
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": "nope"}})
        elif name == "malformed":
            send({"jsonrpc": "2.0", "id": rid, "result": "not an object"})
        elif name in ("progress", "stranger"):
            for step in (1, 2):
                send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
                    "progressToken": token if name == "progress" else "someone-else",
                    "progress": step, "total": 2, "message": f"step {step}"}})
            send({"jsonrpc": "2.0", "id": rid, "result": text})
        elif name == "logs":
            for step in (1, 2):
                send({"jsonrpc": "2.0", "method": "notifications/message",
                      "params": {"level": "info", "logger": "raw", "data": f"log {step}"}})
            send({"jsonrpc": "2.0", "id": rid, "result": text})
        elif name == "late":
            time.sleep(0.5)
            send({"jsonrpc": "2.0", "id": rid, "result": text})
        elif name == "die":
            sys.exit(3)
        elif name == "error32001":
            send({"jsonrpc": "2.0", "id": rid,
                  "error": {"code": -32001, "message": "upstream is busy"}})
        elif name == "bad_result":
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": "not a list"}})
        elif name == "not_jsonrpc":
            send({"id": rid, "answer": 42})
        elif name == "hold":
            held.append(rid)
        elif name == "release":
            send({"jsonrpc": "2.0", "id": rid, "result": text})
            for waiting in held:
                send({"jsonrpc": "2.0", "id": waiting, "result": text})
            held.clear()


if __name__ == "__main__":
    main()
