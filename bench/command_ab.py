"""Bench: `bench/command_large.py`'s seam run for two source trees, interleaved, with the
plain baseline in every round.

    git worktree add /tmp/old <commit>
    .venv/bin/python bench/command_ab.py --old /tmp/old [--new .] [--size-mib 1024] [--rounds 5]
        [--uvloop]

Each run is a fresh `python -P` process with `PYTHONPATH` on its tree (this venv's packages),
so both trees share every dependency and differ only in their code. The order of the two
trees alternates by round, and the medians are compared: this VM's speed swings 2-3x within
minutes, so only runs close in time say anything about a change.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import asyncio, json, shutil, sys, tempfile
from pathlib import Path
sys.path.insert(0, "bench")
from command_large import MiB, plain, through_seam
size = int(sys.argv[1]) * MiB
base = Path(tempfile.mkdtemp(prefix="bench-command-ab-"))
try:
    if sys.argv[2] == "plain":
        print(json.dumps([plain(base, size), 0.0]))
    else:
        if sys.argv[3] == "uvloop":
            import uvloop
            elapsed, _, _, _, cpu = uvloop.run(through_seam(base, size))
        else:
            elapsed, _, _, _, cpu = asyncio.run(through_seam(base, size))
        print(json.dumps([elapsed, cpu]))
finally:
    shutil.rmtree(base)
"""


def run(tree: Path, size_mib: int, kind: str, loop: str = "asyncio") -> tuple[float, float]:
    done = subprocess.run(
        [sys.executable, "-P", "-c", CHILD, str(size_mib), kind, loop],
        cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{kind} run in {tree} failed:\n{done.stderr}")
    elapsed, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return float(elapsed), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the tree to compare against")
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--uvloop", action="store_true", help="run the seam on uvloop (the daemon's loop)")
    options = parser.parse_args()
    trees = {"old": options.old.resolve(), "new": options.new.resolve()}
    runs: dict[str, list[tuple[float, float]]] = {"plain": [], "old": [], "new": []}
    for number in range(options.rounds):
        order = ["old", "new"] if number % 2 == 0 else ["new", "old"]
        runs["plain"].append(run(trees["new"], options.size_mib, "plain"))
        for label in order:
            runs[label].append(run(trees[label], options.size_mib, "seam",
                                   "uvloop" if options.uvloop else "asyncio"))
        print(f"round {number + 1}: " + ", ".join(
            f"{label} {runs[label][-1][0]:.2f} s" for label in ("plain", *order)), flush=True)
    plain_median = statistics.median(elapsed for elapsed, _ in runs["plain"])
    print(f"{options.size_mib:,} MiB of command output, {options.rounds} interleaved rounds "
          f"on {'uvloop' if options.uvloop else 'asyncio'} "
          f"(old: {trees['old']}, new: {trees['new']})")
    print(f"{'run':<7}{'median s':>10}{'x plain':>9}{'CPU s':>8}   runs")
    for label, results in runs.items():
        elapsed = statistics.median(e for e, _ in results)
        cpu = statistics.median(c for _, c in results)
        print(f"{label:<7}{elapsed:>10.2f}{elapsed / plain_median:>9.2f}"
              f"{cpu if label != 'plain' else float('nan'):>8.2f}   "
              + " ".join(f"{e:.2f}" for e, _ in results))


if __name__ == "__main__":
    main()
