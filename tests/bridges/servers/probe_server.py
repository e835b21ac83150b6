"""A bare JSON-RPC line server (standard library only) that tries what a sandbox must allow
or stop, and says what happened: its one tool `probe` takes `{action, target}`:

    read     -> the file's first 200 characters, or the error
    write    -> writes "probe" to the file
    connect  -> opens a TCP connection to "host:port"
    allocate -> allocates `target` MiB
    env      -> the environment, as JSON

Each answer is a text result "ok: ..." or "error: ...". It answers the 2025 handshake, so a
`ServerPool` drives it with `protocol = "legacy"`.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def probe(action: str, target: str) -> str:
    try:
        if action == "read":
            with open(target) as f:
                return "ok: " + f.read(200)
        if action == "write":
            with open(target, "w") as f:
                f.write("probe")
            return "ok: written"
        if action == "connect":
            host, _, port = target.rpartition(":")
            socket.create_connection((host, int(port)), timeout=5).close()
            return "ok: connected"
        if action == "allocate":
            block = bytearray(int(target) * 1024 * 1024)
            return f"ok: {len(block)} bytes"
        if action == "env":
            return "ok: " + json.dumps(dict(os.environ))
    except (OSError, MemoryError, ValueError) as exc:
        return f"error: {type(exc).__name__}: {exc}"
    return "error: unknown action"


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        rid, method = request.get("id"), request.get("method", "")
        params = request.get("params") or {}
        if rid is None:
            continue
        if method == "initialize":
            result: dict = {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                            "capabilities": {"tools": {}},
                            "serverInfo": {"name": "probe", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "probe", "inputSchema": {
                "type": "object", "properties": {"action": {"type": "string"},
                                                 "target": {"type": "string"}}}}]}
        elif method == "tools/call":
            args = params.get("arguments") or {}
            text = probe(str(args.get("action")), str(args.get("target")))
            result = {"content": [{"type": "text", "text": text}]}
        elif method in ("ping", "logging/setLevel"):
            result = {}
        else:
            send({"jsonrpc": "2.0", "id": rid,
                  "error": {"code": -32601, "message": f"Method not found: {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": result})


if __name__ == "__main__":
    main()
