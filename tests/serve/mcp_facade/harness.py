"""Run the MCP facade over a Location, the way `sidecar stdio` / `sidecar serve` will.

    python tests/serve/mcp_facade/harness.py stdio --manifests DIR --state-dir DIR
    python tests/serve/mcp_facade/harness.py http --manifests DIR --state-dir DIR [--port P]
    [--token T]

`http` prints `listening on http://127.0.0.1:PORT` to stderr once it serves (`--token` empty:
no authentication). Logs go to stderr; stdout carries only MCP messages in stdio mode.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from pathlib import Path

import uvicorn

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from sidecar import Location  # noqa: E402
from sidecar.serve.app import build_app  # noqa: E402
from sidecar.serve.mcp_facade import mcp_http, serve_stdio  # noqa: E402


async def main(args: argparse.Namespace) -> None:
    async with Location.open(
        args.root, state_dir=args.state_dir, manifests=args.manifests, watch=args.watch
    ) as location:
        if args.mode == "stdio":
            await serve_stdio(location)
            return
        routes, lifespan = mcp_http(location)
        app = build_app(location, token=args.token or None, extra_routes=routes,
                        extra_lifespan=lifespan)
        sock = socket.create_server(("127.0.0.1", args.port))
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        print(f"listening on http://127.0.0.1:{port}", file=sys.stderr, flush=True)
        await task


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["stdio", "http"])
    parser.add_argument("--manifests", action="append", default=[])
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--root", default=".")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default="")
    parser.add_argument("--watch", action="store_true")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        asyncio.run(main(parser.parse_args()))
    except KeyboardInterrupt:
        pass
