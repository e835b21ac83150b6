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

import asyncio
import statistics
import tempfile
from pathlib import Path

from compare_children import launch_seconds, write_manifest
from stdio_ab import source_trees, trees_parser


async def main(sources: dict[str, Path], upstream: str, servers: int, rounds: int) -> str:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        manifests = write_manifest(tmp / "manifests", servers, upstream=upstream)
        times: dict[str, list[float]] = {"old": [], "new": []}
        for number in range(rounds):
            for name in ("old", "new") if number % 2 else ("new", "old"):
                state = tmp / f"state-{name}-{number}"
                times[name].append(
                    await launch_seconds(sources[name], manifests, state, servers))
    ratios = [new / old for old, new in zip(times["old"], times["new"], strict=True)]
    old, new = times["old"], times["new"]
    return (f"{rounds} rounds, {servers} {upstream} upstream(s): old median "
            f"{statistics.median(old):.3f} s (best {min(old):.3f}), new median "
            f"{statistics.median(new):.3f} s (best {min(new):.3f}); new / old "
            f"{statistics.median(ratios):.2f} (old: {sources['old']}, new: {sources['new']})")


if __name__ == "__main__":
    parser = trees_parser(__doc__)
    parser.add_argument("--upstream", choices=["sdk", "light", "sh"], default="sdk")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    opts = parser.parse_args()
    print(asyncio.run(main(source_trees(opts), opts.upstream, opts.servers, opts.rounds)))
