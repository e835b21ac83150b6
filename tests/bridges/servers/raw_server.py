"""A bare JSON-RPC line server for the direct-request tests: it answers `tools/call` by the
tool's name with exactly the bytes a misbehaving or slow server might send.

    echo       -> a text result                 error     -> a JSON-RPC error
    malformed  -> a result that is not an object progress  -> two progress notifications, then
    late       -> answers after 0.5 s              a result
    stranger   -> progress with a token nobody gave, then a result
    logs       -> two log messages, then a result
    die        -> exits with status 3 without answering

Every notification it receives is written to stderr as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            sys.stderr.write(json.dumps(message) + "\n")
            sys.stderr.flush()
            continue
        rid, params = message["id"], message.get("params") or {}
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


if __name__ == "__main__":
    main()
