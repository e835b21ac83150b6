"""A handshake-era (2025-06-18) MCP server over stdio, standard library only.

    python legacy_server.py [--events FILE] [--startup-delay S] [--start-together N]
        [--ignore-unknown] [--exit-at-start N] [--hang-at-start] [--secret-env NAME]

It knows `initialize`, `notifications/initialized`, `ping`, `tools/list` and `tools/call`
(tools `echo`, `slow` (blocks: it cannot be cancelled) and `crash`). Any other request gets
JSON-RPC -32601, as the spec requires, so a `mode="auto"` client's `server/discover` probe
fails fast and it falls back to `initialize`. With `--ignore-unknown` it never answers
unknown methods (a server of the kind that makes the auto probe wait; `protocol = "legacy"`
avoids the probe). It starts in a few milliseconds: the cheap server for tests that start many.
With `--start-together N` it reads stdin only once `--events` holds N `start` events (N servers
running at once), and exits 5 if that has not happened within 60 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def event(path: str | None, name: str) -> None:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": name, "pid": os.getpid(), "t": time.time()}) + "\n")


def wait_for_starts(path: str, count: int, within: float = 60.0) -> None:
    """Until `path` holds `count` start events (those of the other servers too)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with open(path) as f:
            if f.read().count('"event": "start"') >= count:
                return
        time.sleep(0.02)
    print(f"fewer than {count} servers started within {within:g} s", file=sys.stderr, flush=True)
    sys.exit(5)


TOOLS = [
    {"name": "echo", "description": "Echo the text back",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                     "required": ["text"]}},
    {"name": "slow", "description": "Sleep",
     "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
    {"name": "crash", "description": "Exit mid-call", "inputSchema": {"type": "object"}},
]


def reply(message_id: object, result: object = None, error: object = None) -> None:
    body: dict[str, object] = {"jsonrpc": "2.0", "id": message_id}
    if error is not None:
        body["error"] = error
    else:
        body["result"] = result
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()


def handle(message: dict[str, object], args: argparse.Namespace) -> None:
    method = message.get("method")
    if "id" not in message:
        return  # a notification
    message_id = message["id"]
    if method == "initialize":
        reply(message_id, {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "legacy-test", "version": "1.0"},
        })
    elif method == "ping":
        reply(message_id, {})
    elif method == "tools/list":
        reply(message_id, {"tools": TOOLS})
    elif method == "tools/call":
        params = message.get("params") or {}
        assert isinstance(params, dict)
        arguments = params.get("arguments") or {}
        if params.get("name") == "crash":
            print("about to crash", file=sys.stderr, flush=True)
            os._exit(3)
        if params.get("name") == "slow":
            time.sleep(float(arguments.get("seconds", 1)))
        text = arguments.get("text", "done")
        reply(message_id, {"content": [{"type": "text", "text": text}], "isError": False})
    elif not args.ignore_unknown:
        reply(message_id, error={"code": -32601, "message": f"Method not found: {method}"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events")
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument("--start-together", type=int)
    parser.add_argument("--ignore-unknown", action="store_true")
    parser.add_argument("--exit-at-start", type=int)
    parser.add_argument("--hang-at-start", action="store_true")
    parser.add_argument("--secret-env")
    args = parser.parse_args()
    event(args.events, "start")
    if args.secret_env:
        print(f"starting with {args.secret_env}={os.environ.get(args.secret_env)}",
              file=sys.stderr, flush=True)
    if args.exit_at_start is not None:
        print("cannot start: exiting on purpose", file=sys.stderr, flush=True)
        sys.exit(args.exit_at_start)
    if args.hang_at_start:
        time.sleep(3600)
    time.sleep(args.startup_delay)
    if args.start_together is not None:
        wait_for_starts(args.events, args.start_together)
    event(args.events, "ready")
    for line in sys.stdin:
        if line.strip():
            handle(json.loads(line), args)


if __name__ == "__main__":
    main()
