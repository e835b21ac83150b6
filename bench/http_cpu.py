"""CPU per call on `/mcp`, on both sides: the daemon's and the client's (issue 8).

    .venv/bin/python bench/http_cpu.py [--calls N] [--rounds R] [--no-mcp-proxy]

Starts `sidecar serve` over the bench upstream (`protocol: legacy`, as in `compare.py`) and,
when its venv exists, mcp-proxy over the same upstream; then, per round and target, N
sequential `echo` calls through one `mcp.Client`. Prints calls/s, p50, the server process's
CPU per call (from /proc) and this process's (the client's) CPU per call. A sequential call is
the client's CPU, the proxy's and the upstream's one after the other: this shows which one a
change moved.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare


async def measure(target: compare.Target, calls: int) -> str:
    async with target.connect() as client:
        tool = await compare.find_tool(client, "echo")
        for _ in range(min(100, calls)):
            await compare.call(client, tool, {"text": "hi"})
        server0 = compare.cpu_seconds(target.server_pid)
        client0 = time.process_time()
        start = time.perf_counter()
        latencies = []
        for _ in range(calls):
            began = time.perf_counter()
            await compare.call(client, tool, {"text": "hi"})
            latencies.append(time.perf_counter() - began)
        elapsed = time.perf_counter() - start
        server_cpu = compare.cpu_seconds(target.server_pid) - server0
        client_cpu = time.process_time() - client0
    latencies.sort()
    return (f"| {target.name} | {calls / elapsed:.0f} | {1e3 * latencies[calls // 2]:.2f} | "
            f"{1e6 * server_cpu / calls:.0f} | {1e6 * client_cpu / calls:.0f} |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-mcp-proxy", action="store_true")
    opts = parser.parse_args()
    targets = compare.Targets(Path(tempfile.mkdtemp(prefix="http-cpu-")))
    async with targets.stack:
        chosen = [await targets.sidecar_http()]
        if not opts.no_mcp_proxy:
            chosen.append(await targets.mcp_proxy())
        print("| target | calls/s | p50 ms | server cpu µs/call | client cpu µs/call |")
        print("|---|---|---|---|---|")
        for _ in range(opts.rounds):
            for target in chosen:
                if target.unavailable:
                    print(f"| {target.name} | {target.unavailable} | | | |")
                    continue
                print(await measure(target, opts.calls), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
