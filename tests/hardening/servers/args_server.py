"""A bare MCP stdio server with one tool, `deploy`, that answers with the arguments it
received as JSON: what an upstream is actually sent."""

from __future__ import annotations

import json
import sys

DEPLOY = {"name": "deploy", "description": "deploys", "inputSchema": {
    "type": "object", "required": ["env", "target"],
    "properties": {"env": {"type": "string"}, "target": {"type": "string"}}}}


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        rid, method, params = message["id"], message["method"], message.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                "serverInfo": {"name": "args", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [DEPLOY]}})
        elif method == "tools/call":
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": [
                {"type": "text", "text": json.dumps(params.get("arguments") or {})}]}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "result": {}})


if __name__ == "__main__":
    main()
