"""Bench: where a sequential call through `sidecar stdio` spends its time, segment by segment.

    .venv/bin/python bench/call_timeline.py [--blocks 40] [--calls 50] [--protocol legacy|auto]

A `sidecar stdio` daemon with time stamps on its call path (`bench/timeline_hooks.py`) and a
direct stdio session to the same kind of upstream (`bench/upstream.py`) take turns in blocks of
`--calls` sequential `echo` calls, the order alternating by block, as `bench/stdio_ab.py` does.
It prints both rates, their ratio (median over blocks), and the median of each segment of the
daemon's calls: what the daemon does before and after the upstream, the upstream's round trip
as the daemon sees it, the outcome record's hop through the writer thread, and the client's
turn. Medians are per segment, so they need not add up to the median call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from compare import UPSTREAM, find_tool, mcp_client, stdio_params, write_manifest
from stdio_ab import summary, take_turns
from timeline_hooks import SEGMENTS, calls, segment_times

HERE = Path(__file__).resolve().parent
DAEMON = (
    "import runpy, sys; from pathlib import Path; import timeline_hooks; "
    "timeline_hooks.install(Path(sys.argv[1])); sys.argv = ['sidecar', *sys.argv[2:]]; "
    "runpy.run_module('sidecar.cli', run_name='__main__', alter_sys=True)"
)


def report(events: list[tuple[str, int]], ratios: list[float], rates: dict[str, list[float]],
           opts: argparse.Namespace) -> list[str]:
    grouped = calls(events)[opts.warm:]
    times = segment_times(grouped)
    sidecar, direct = statistics.median(rates["sidecar"]), statistics.median(rates["direct"])
    lines = [
        f"call timeline: `sidecar stdio` (upstream protocol {opts.protocol}) and direct stdio "
        f"taking turns, {opts.blocks} blocks x {opts.calls} sequential calls",
        f"calls/s: sidecar {sidecar:.0f}, direct {direct:.0f}; sidecar / direct "
        f"{summary(ratios)}",
        f"median call: sidecar {1e6 / sidecar:.0f} us, direct {1e6 / direct:.0f} us "
        f"({len(grouped)} daemon calls timed)",
        "",
        "| segment (daemon's clock) | median us | p90 us |",
        "|---|---|---|",
    ]

    def row(what: str, values: list[float]) -> None:
        if values:
            p90 = statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
            lines.append(f"| {what} | {statistics.median(values):.1f} | {p90:.1f} |")
        else:
            lines.append(f"| {what} | – | – |")

    for segment in SEGMENTS:
        row(segment[2], times[segment])
    row("the client's turn (answer written -> next request taken)", times["client"])
    daemon = sum(statistics.median(times[s]) for s in SEGMENTS if s[:2] != ("write", "answer")
                 and times[s])
    record = sum(statistics.median(times[s]) for s in SEGMENTS
                 if s[2].startswith("outcome record") and times[s])
    lines += [
        "",
        f"daemon on the call's path (sum of its segments' medians): {daemon:.0f} us, of which "
        f"the outcome record {record:.0f} us",
    ]
    return lines


async def main(opts: argparse.Namespace) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        manifests = write_manifest(tmp / "manifests",
                                   protocol=None if opts.protocol == "auto" else opts.protocol)
        out = tmp / "events.json"
        state = tmp / "state"
        async with AsyncExitStack() as stack:
            daemon = stdio_params(
                sys.executable,
                ["-P", "-c", DAEMON, str(out), "stdio", "--standalone", "--manifests", str(manifests),
                 "--state-dir", str(state)],
                env={"PYTHONPATH": f"{HERE}:{HERE.parent}", "SIDECAR_STATE_DIR": str(state)})
            clients: dict[str, tuple[Any, str]] = {}
            for name, params in (("direct", stdio_params(sys.executable, [str(UPSTREAM)])),
                                 ("sidecar", daemon)):
                client = await stack.enter_async_context(mcp_client(params))
                tool = await find_tool(client, "echo")
                for _ in range(opts.warm):
                    await client.call_tool(tool, {"text": "hi"})
                clients[name] = (client, tool)
            ratios, rates = await take_turns(clients, ("direct", "sidecar"), opts.blocks,
                                             opts.calls)
        for _ in range(100):  # the daemon writes its events as it exits
            if out.exists():
                break
            await asyncio.sleep(0.05)
        events = [(label, at) for label, at in json.loads(out.read_text())]
    return report(events, ratios, rates, opts)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--calls", type=int, default=50, help="sequential calls per block")
    parser.add_argument("--warm", type=int, default=100, help="calls on each session first")
    parser.add_argument("--protocol", choices=("legacy", "auto"), default="legacy",
                        help="the upstream's `protocol` in the manifest (compare.py's rows)")
    print("\n".join(asyncio.run(main(parser.parse_args()))))
