"""Bridge benchmark: a large upstream text result over stdio, through the pool and the seam.

    .venv/bin/python bench/bridge_large.py [--mb 100] [--line 100] [--loop asyncio|uvloop]

An MCP server (tests/bridges/servers/testserver.py, the `mcp` SDK over stdio) returns one text
of M MB in lines of `--line` bytes. The daemon side (this process) runs a real `Location` and a
`ServerPool`, calls the tool through `Snapshot.execute`, and the seam bounds the text and
retains it whole in the managed store. Measured in this process only (the upstream is a child):

- time from the call to the outcome (the upstream's own time to build and write the text is
  included: it is what a caller waits for);
- peak RSS: VmHWM after `/proc/self/clear_refs` (5 resets the high-water mark) right before the
  call, next to VmRSS at that moment (the baseline).

The retained text is checked to be byte-complete (its size equals the payload).
Targets (issue 4): under 10 s, peak RSS under 3x the payload.
Baselines from shared/notes/anchor-bench.md (same kind of machine): the SDK's own stdio reader
takes 87 s for 100 MB; FastMCP and mcp-proxy take 90-182 s with a peak 6-7x the payload.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridges.manifest.loading import ServerConfig, Timeouts  # noqa: E402
from bridges.mcp import ServerPool  # noqa: E402
from sidecar import Location, ToolContext  # noqa: E402

SERVER = ROOT / "tests" / "bridges" / "servers" / "testserver.py"
MB = 1_000_000


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


async def run(mb: int, line: int) -> dict[str, float]:
    payload = mb * MB
    with tempfile.TemporaryDirectory() as tmp:
        async with Location.open(tmp, state_dir=Path(tmp) / "state") as location:
            config = ServerConfig(
                command=sys.executable, args=[str(SERVER)], timeouts=Timeouts(call=600)
            )
            async with ServerPool({"bench": config}, location.tools) as pool:
                health = pool.health()["bench"]
                if health.state != "ready":
                    raise SystemExit(f"server did not start: {health.last_error}")
                snapshot = location.snapshot()
                ctx = ToolContext(session_id="bench", agent="bench", message_id="m", call_id="c")
                reset_peak()
                baseline = status_kib("VmRSS")
                started = time.perf_counter()
                outcome = await snapshot.execute(
                    "bench_big", {"bytes": payload, "line": line}, ctx
                )
                elapsed = time.perf_counter() - started
                peak = status_kib("VmHWM")
            if outcome.status != "completed" or not outcome.managed:
                raise SystemExit(f"unexpected outcome: {outcome.status} {outcome.error}")
            retained = outcome.managed[0].size_bytes
            if retained != payload:
                raise SystemExit(f"retained {retained} bytes, expected {payload}")
    return {
        "seconds": elapsed,
        "baseline_mb": baseline / 1024,
        "peak_mb": peak / 1024,
        "payload_mb": payload / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--line", type=int, default=100, help="bytes per line of the text")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(run(args.mb, args.line))
    else:
        result = asyncio.run(run(args.mb, args.line))
    payload = result["payload_mb"]
    peak, base = result["peak_mb"], result["baseline_mb"]
    print(f"bridge_large: {args.mb} MB text over stdio -> pool -> seam ({args.loop})")
    print(f"{'measure':<34}{'value':>12}{'target':>12}{'baseline':>14}")
    print(f"{'time (s)':<34}{result['seconds']:>12.2f}{'< 10':>12}{'87-182':>14}")
    print(f"{'peak RSS (MiB)':<34}{peak:>12.0f}{f'< {3 * payload:.0f}':>12}{'':>14}")
    print(f"{'peak RSS / payload':<34}{peak / payload:>12.2f}{'< 3':>12}{'6-7':>14}")
    print(f"{'RSS before the call (MiB)':<34}{base:>12.0f}{'':>12}{'':>14}")
    print(f"{'peak above that / payload':<34}{(peak - base) / payload:>12.2f}{'':>12}{'':>14}")
    print("baseline: shared/notes/anchor-bench.md (SDK stdio reader 87 s; proxies 90-182 s, 6-7x)")


if __name__ == "__main__":
    main()
