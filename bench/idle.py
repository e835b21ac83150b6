"""What an idle daemon costs: `sidecar daemon` on the bench's manifest (one upstream over
pipes), `sidecar stdio` attached to it as an agent's client stays attached between its calls, a
few hundred calls to warm it, then nothing for `--seconds` in rounds. Per round: the daemon's
CPU per second (every thread, from /proc/PID/task/*/schedstat) and its threads' wake-ups per
second (the times a thread was put on a CPU). Printed, not written to RESULTS.md.

    .venv/bin/python bench/idle.py [--seconds S] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

import compare  # bench/, this script's directory, is first on sys.path


def _threads(pid: int) -> tuple[int, int]:
    """(CPU nanoseconds, times put on a CPU), summed over the process's threads."""
    cpu = runs = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                fields = f.read().split()
        except OSError:  # the thread ended
            continue
        cpu, runs = cpu + int(fields[0]), runs + int(fields[2])
    return cpu, runs


async def measure(seconds: float, rounds: int) -> list[tuple[float, float]]:
    found: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        manifests = compare.write_manifest(Path(tmp) / "m", protocol="legacy")
        state = Path(tmp) / "state"
        daemon = compare.start_daemon(
            [sys.executable, "-m", "sidecar.cli", "daemon", "--manifests", str(manifests),
             "--state-dir", str(state)], state)
        try:
            await compare.wait_state_daemon(daemon, state)
            async with compare.mcp_client(compare.attached_stdio(manifests, state)) as client:
                name = await compare.find_tool(client, "echo")
                for _ in range(300):
                    await compare.call(client, name, {"text": "warm"})
                await asyncio.sleep(2.0)  # the rows written behind, the last timers
                loop = asyncio.get_running_loop()
                for _ in range(rounds):
                    (cpu, runs), began = _threads(daemon.pid), loop.time()
                    await asyncio.sleep(seconds)
                    (cpu2, runs2), took = _threads(daemon.pid), loop.time() - began
                    found.append(((cpu2 - cpu) / 1e6 / took, (runs2 - runs) / took))
        finally:
            compare.stop(daemon)
            daemon.wait(timeout=30)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="one round's length")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    found = asyncio.run(measure(args.seconds, args.rounds))
    print(f"- machine: {os.uname().machine}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f} after the run")
    print(f"- command: `.venv/bin/python bench/idle.py --seconds {args.seconds:g} --rounds "
          f"{args.rounds}`\n")
    print("| round | daemon CPU ms per s | wake-ups per s |")
    print("|---|---|---|")
    for number, (cpu, runs) in enumerate(found, 1):
        print(f"| {number} | {cpu:.2f} | {runs:.1f} |")
    print(f"| median | {statistics.median(c for c, _ in found):.2f} | "
          f"{statistics.median(r for _, r in found):.1f} |")


if __name__ == "__main__":
    main()
