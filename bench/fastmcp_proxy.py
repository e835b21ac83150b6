"""FastMCP's proxy in front of one stdio MCP server, for `bench/compare.py`.

    bench/.venvs/fastmcp/bin/python bench/fastmcp_proxy.py [--limit BYTES] -- CMD ARG...

Runs `fastmcp.server.create_proxy({"mcpServers": {"up": {...}}})` over stdio (this process
is run by the benchmark's MCP client). `--limit` adds FastMCP's opt-in
`ResponseLimitingMiddleware(max_size=BYTES)`. Runs in its own virtualenv (bench/.venvs/fastmcp)
because fastmcp pins its own `mcp`.
"""

from __future__ import annotations

import argparse

from fastmcp.server import create_proxy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = [a for a in args.command if a != "--"]
    proxy = create_proxy({"mcpServers": {"up": {"command": argv[0], "args": argv[1:]}}})
    if args.limit:
        from fastmcp.server.middleware.response_limiting import ResponseLimitingMiddleware

        proxy.add_middleware(ResponseLimitingMiddleware(max_size=args.limit))
    proxy.run(transport="stdio", show_banner=False)


if __name__ == "__main__":
    main()
