"""A minimal MCP server over stdio that imports nothing heavy (no SDK): JSON-RPC by hand.

For the startup benchmark: with `bench/upstream.py` each server first spends ~0.8 s of CPU
importing the `mcp` SDK, so 20 of them on 2 cores measure the machine, not the sidecar. This one
starts in ~30 ms, so 20 of them show how the sidecar's own start scales.

Speaks the 2025 handshake (`initialize`, `tools/list` with one `echo` tool, `tools/call`,
`ping`); any other request gets a JSON-RPC "method not found" error at once, so the sidecar's
`auto` probe (`server/discover`) falls back immediately.
"""

from __future__ import annotations

import json
import sys

ECHO = {
    "name": "echo",
    "description": "Echo the text back",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                    "required": ["text"]},
}


def reply(message_id: object, result: object = None, error: object = None) -> None:
    body: dict[str, object] = {"jsonrpc": "2.0", "id": message_id}
    if error is not None:
        body["error"] = error
    else:
        body["result"] = result
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()


def handle(message: dict[str, object]) -> None:
    if "id" not in message:
        return  # a notification
    method = message.get("method")
    params = message.get("params") or {}
    assert isinstance(params, dict)
    if method == "initialize":
        reply(message["id"], {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "light-upstream", "version": "1.0"},
        })
    elif method == "tools/list":
        reply(message["id"], {"tools": [ECHO]})
    elif method == "tools/call":
        text = str((params.get("arguments") or {}).get("text", ""))
        reply(message["id"], {"content": [{"type": "text", "text": text}]})
    elif method == "ping":
        reply(message["id"], {})
    else:
        reply(message["id"], error={"code": -32601, "message": f"method not found: {method}"})


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            handle(json.loads(line))


if __name__ == "__main__":
    main()
