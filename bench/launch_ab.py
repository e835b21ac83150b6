"""Bench: the launch of `sidecar stdio` from two source trees, taking turns.

    git worktree add -f /tmp/old <commit> --detach
    .venv/bin/python bench/launch_ab.py --old /tmp/old [--new .] [--upstream sdk|light|sh]
        [--servers 1] [--rounds 8]
    git worktree remove --force /tmp/old

What a user waits for when an MCP client spawns `sidecar stdio`: from starting the process
(`python -P -m sidecar.cli stdio`, `PYTHONPATH` on the tree, so both trees share this venv's
packages) until its `tools/list` answer names every upstream's `echo`, over its real
stdin/stdout (`compare_children.py launch` measures the same for one tree). The trees take
turns, the order alternating by round; each launch has a fresh state directory. Prints the
median and best of each tree and the median of the same-round ratios (new over old).
A fresh worktree has no bytecode cache: run `python -m compileall -q` on both trees first, or
the first launches of one side compile its sources.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from compare_children import write_manifest

HERE = Path(__file__).resolve().parent


async def launch(tree: Path, manifests: Path, state: Path, servers: int) -> float:
    """Seconds from starting `sidecar stdio` in `tree` to a `tools/list` with every server."""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "sidecar.cli", "stdio", "--manifests", str(manifests),
        "--state-dir", str(state), env=dict(os.environ, PYTHONPATH=str(tree)), cwd=tree,
        limit=2**26, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    await proc.stdin.drain()
    while True:
        line = await proc.stdout.readline()
        if not line:
            raise SystemExit(f"sidecar stdio from {tree} exited before answering tools/list")
        message = json.loads(line)
        if message.get("id") == 2:
            break
    elapsed = time.perf_counter() - start
    proc.stdin.close()
    await proc.wait()
    echoes = [t["name"] for t in message["result"]["tools"] if t["name"].endswith("_echo")]
    if len(echoes) != servers:
        raise SystemExit(f"{tree}: tools/list named {len(echoes)} upstream echoes, not {servers}")
    return elapsed


async def main(trees: dict[str, Path], upstream: str, servers: int, rounds: int) -> str:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        manifests = write_manifest(tmp / "manifests", servers, upstream=upstream)
        times: dict[str, list[float]] = {"old": [], "new": []}
        for number in range(rounds):
            for name in ("old", "new") if number % 2 else ("new", "old"):
                state = tmp / f"state-{name}-{number}"
                times[name].append(await launch(trees[name], manifests, state, servers))
    ratios = [new / old for old, new in zip(times["old"], times["new"], strict=True)]
    old, new = times["old"], times["new"]
    return (f"{rounds} rounds, {servers} {upstream} upstream(s): old median "
            f"{statistics.median(old):.3f} s (best {min(old):.3f}), new median "
            f"{statistics.median(new):.3f} s (best {min(new):.3f}); new / old "
            f"{statistics.median(ratios):.2f} (old: {trees['old']}, new: {trees['new']})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the tree to compare against")
    parser.add_argument("--new", type=Path, default=HERE.parent, help="default: this tree")
    parser.add_argument("--upstream", choices=["sdk", "light", "sh"], default="sdk")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    opts = parser.parse_args()
    trees = {"old": opts.old.resolve(), "new": opts.new.resolve()}
    print(asyncio.run(main(trees, opts.upstream, opts.servers, opts.rounds)))
