"""A bare MCP stdio server with tools of every size: `fine` (small), `big` (~900 KB of
inputSchema) and `huge` (~5 MB). `relist` announces `tools/list_changed` and from then on
lists `huge2` (~5 MB) and `big2` as well, as a live reload would."""

from __future__ import annotations

import json
import sys


def schema(properties: int) -> dict:
    return {"type": "object", "properties": {
        f"p{i}": {"type": "string", "description": "d" * 100} for i in range(properties)}}


def tool(name: str, properties: int) -> dict:
    return {"name": name, "description": name, "inputSchema": schema(properties)}


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    tools = [tool("fine", 1), tool("relist", 1), tool("big", 6500), tool("huge", 36000)]
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        rid, method, params = message["id"], message["method"], message.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "schemas", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}})
        elif method == "tools/call":
            if params["name"] == "relist":
                tools = [*tools, tool("huge2", 36000), tool("big2", 6500)]
                send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "content": [{"type": "text", "text": f"called {params['name']}"}]}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "result": {}})


if __name__ == "__main__":
    main()
