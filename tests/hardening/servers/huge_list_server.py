"""A hostile MCP stdio server whose `tools/list` answer is huge: `HUGE_LIST_MB` megabytes of
JSON (many tools, each with an `inputSchema` of many small properties: structure, not one long
string), written in 1 MiB pieces. With `HUGE_LIST_MARKS` set to a folder, it creates
`piece-N` there after writing piece N and waits for the test to create `ack-N` before it
writes the next, so that a test can order its own requests against the send. With
`HUGE_LIST_TOOLS` set to a number, the listing is that many small tools instead (about 300
bytes each: 66,000 make 20 MB)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

PIECE = 1 << 20


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def handshake(piece: int) -> None:
    folder = os.environ.get("HUGE_LIST_MARKS")
    if not folder:
        return
    Path(folder, f"piece-{piece}").touch()
    ack = Path(folder, f"ack-{piece}")
    deadline = time.monotonic() + 120
    while not ack.exists() and time.monotonic() < deadline:
        time.sleep(0.005)


def small_tools(count: int) -> list[dict]:
    return [{"name": f"tool_{k:06d}", "description": f"small tool number {k} of {count}, "
             "listed to make the listing long", "inputSchema": {
                 "type": "object", "properties": {
                     "query": {"type": "string", "description": "what to look for"},
                     "limit": {"type": "integer", "minimum": 1, "maximum": 100}},
                 "required": ["query"]}} for k in range(count)]


def listing(rid: int | str, megabytes: float) -> bytes:
    if os.environ.get("HUGE_LIST_TOOLS"):
        tools = small_tools(int(os.environ["HUGE_LIST_TOOLS"]))
        return (json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}})
                + "\n").encode()
    schema = {"type": "object", "properties": {
        f"p{i}": {"type": "string", "description": "d" * 40} for i in range(200)}}
    one = len(json.dumps(schema))
    count = max(1, int(megabytes * 1e6 / one))
    tools = [{"name": f"t{k}", "description": "t", "inputSchema": schema} for k in range(count)]
    return (json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}}) + "\n").encode()


def main() -> None:
    megabytes = float(os.environ.get("HUGE_LIST_MB", "50"))
    out = sys.stdout.buffer
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        rid, method, params = message["id"], message["method"], message.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "huge-list", "version": "1"}}})
        elif method == "tools/list":
            data = listing(rid, megabytes)
            for piece, start in enumerate(range(0, len(data), PIECE)):
                out.write(data[start : start + PIECE])
                out.flush()
                handshake(piece)
        else:
            send({"jsonrpc": "2.0", "id": rid, "result": {}})


if __name__ == "__main__":
    main()
