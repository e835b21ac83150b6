"""Bench: `sidecar stdio` from two source trees, taking turns on the same upstream.

    git worktree add -f /tmp/old <commit> --detach
    .venv/bin/python bench/stdio_ab.py --old /tmp/old [--new .] [--blocks 100] [--calls 50]
        [--callers 1] [--old-python PATH] [--new-python PATH]
    git worktree remove --force /tmp/old

For a change to the bridge's hot path, whose effect (a few per cent) is smaller than this VM's
swings between two runs of `./scripts/bench --only bridge` (0.56x-0.64x direct). Each tree runs
as `python -P -m sidecar.cli stdio` with `PYTHONPATH` on the tree, so both share this venv's
packages and differ only in their code; both serve the same manifest (`bench/upstream.py`,
`protocol: legacy`, as `compare.py`'s `sidecar stdio` row) from a state directory of their own.
One `mcp.Client` each, warmed up; then they take turns in blocks of `--calls` calls to `echo`
per caller (`--callers` at once, 1: sequential), the order alternating by block. The ratio is
the median over blocks of the new tree's rate over the old tree's in the same block, with the
25th-75th percentile: the VM's speed swings hit both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from compare import find_tool, mcp_client, write_manifest
from mcp import StdioServerParameters

HERE = Path(__file__).resolve().parent
WARM_CALLS = 100


async def block(client: Any, tool: str, callers: int, calls: int) -> float:
    """Calls per second of `callers` tasks making `calls` sequential calls each."""

    async def caller() -> None:
        for _ in range(calls):
            await client.call_tool(tool, {"text": "hi"})

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return callers * calls / (time.perf_counter() - start)


async def take_turns(
    clients: dict[str, tuple[Any, str]], names: tuple[str, str], blocks: int, calls: int,
    callers: int = 1,
) -> tuple[list[float], dict[str, list[float]]]:
    """`blocks` blocks in which both clients (name -> client, tool) run `block`, the order
    alternating; the ratios of the second name's rate over the first's per block, and the
    rates."""
    base, other = names
    ratios: list[float] = []
    rates: dict[str, list[float]] = {name: [] for name in names}
    for number in range(blocks):
        rate: dict[str, float] = {}
        for name in names if number % 2 else names[::-1]:
            client, tool = clients[name]
            rate[name] = await block(client, tool, callers, calls)
            rates[name].append(rate[name])
        ratios.append(rate[other] / rate[base])
    return ratios, rates


def summary(ratios: list[float]) -> str:
    """The median ratio and its middle half (25th-75th percentile)."""
    low, _, high = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.3f} (middle half {low:.3f}-{high:.3f})"


async def main(trees: dict[str, Path], blocks: int, calls: int, callers: int,
               pythons: dict[str, str] | None = None) -> str:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        manifests = write_manifest(tmp / "manifests", protocol="legacy")
        async with AsyncExitStack() as stack:
            clients: dict[str, tuple[Any, str]] = {}
            for name, tree in trees.items():
                state = tmp / f"state-{name}"
                params = StdioServerParameters(
                    command=(pythons or {}).get(name, sys.executable),
                    args=["-P", "-m", "sidecar.cli", "stdio", "--manifests", str(manifests),
                          "--state-dir", str(state)],
                    env={"PYTHONPATH": str(tree), "SIDECAR_STATE_DIR": str(state)},
                    cwd=str(tree))
                client = await stack.enter_async_context(mcp_client(params))
                tool = await find_tool(client, "echo")
                for _ in range(WARM_CALLS):
                    await client.call_tool(tool, {"text": "hi"})
                clients[name] = (client, tool)
            ratios, rates = await take_turns(clients, ("old", "new"), blocks, calls, callers)
    mode = "sequential" if callers == 1 else f"{callers} callers x"
    return (f"{blocks} blocks of {mode} {calls} calls: new / old {summary(ratios)}; calls/s old "
            f"{statistics.median(rates['old']):.0f}, new {statistics.median(rates['new']):.0f} "
            f"(old: {trees['old']}, new: {trees['new']}"
            + ("" if pythons is None else f"; pythons: {pythons['old']}, {pythons['new']}")
            + ")")


def trees_parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser with `--old` and `--new`, the two source trees (see `source_trees`)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the tree to compare against")
    parser.add_argument("--new", type=Path, default=HERE.parent, help="default: this tree")
    return parser


def source_trees(opts: argparse.Namespace) -> dict[str, Path]:
    return {"old": opts.old.resolve(), "new": opts.new.resolve()}


if __name__ == "__main__":
    parser = trees_parser(__doc__)
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--calls", type=int, default=50, help="calls per caller per block")
    parser.add_argument("--callers", type=int, default=1, help="concurrent callers per block")
    parser.add_argument("--old-python", default=sys.executable,
                        help="the interpreter of the old side (its venv holds the packages)")
    parser.add_argument("--new-python", default=sys.executable)
    opts = parser.parse_args()
    pythons = ({"old": opts.old_python, "new": opts.new_python}
               if opts.old_python != sys.executable or opts.new_python != sys.executable
               else None)
    print(asyncio.run(main(source_trees(opts), opts.blocks, opts.calls, opts.callers, pythons)))
