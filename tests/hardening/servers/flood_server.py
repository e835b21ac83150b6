"""A bare MCP stdio server whose tool `flood` writes `lines` log notifications and as many
stderr lines (100 bytes each) before it answers: a server flooding the daemon's log. Its tool
`deep` answers with a result nested `depth` arrays deep: a server sending JSON the daemon's
parser cannot follow."""

from __future__ import annotations

import json
import sys


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
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}, "logging": {}},
                "serverInfo": {"name": "flood", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [{
                "name": "flood", "description": "floods the log",
                "inputSchema": {"type": "object", "properties": {"lines": {"type": "integer"}}},
            }, {
                "name": "deep", "description": "answers with deeply nested JSON",
                "inputSchema": {"type": "object", "properties": {"depth": {"type": "integer"}}},
            }]}})
        elif method == "tools/call" and params["name"] == "deep":
            depth = int(params["arguments"]["depth"])
            sys.stdout.write('{"jsonrpc": "2.0", "id": ' + json.dumps(rid) + ', "result": '
                             '{"content": ' + "[" * depth + "]" * depth + "}}\n")
            sys.stdout.flush()
        elif method == "tools/call":
            lines = int(params["arguments"]["lines"])
            notification = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                       "params": {"level": "info", "data": "x" * 80}}) + "\n"
            sys.stdout.write(notification * lines)
            sys.stdout.flush()
            sys.stderr.write(("e" * 99 + "\n") * lines)
            sys.stderr.flush()
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "content": [{"type": "text", "text": f"flooded {lines}"}]}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "result": {}})


if __name__ == "__main__":
    main()
