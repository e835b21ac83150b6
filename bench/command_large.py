"""Bench: a `command` manifest tool producing 1 GiB of stdout, through the whole seam.

    .venv/bin/python bench/command_large.py [--size-mib 1024] [--dir DIR]

Prints wall time and the daemon's peak RSS (VmHWM after resetting it with
/proc/self/clear_refs) for:

- seam:  one call of a command tool whose stdout is spooled to the managed store (fsynced),
         with the preview and the durable outcome;
- plain: the same producer with its stdout redirected to a file, then fsync (the baseline);
- dd:    dd copying the same bytes (prepared on /dev/shm) to a file with conv=fsync.

Baselines run before and after the seam; the best of each is the one compared to. The disk of
a shared VM is noisy: run it a few times.

Targets: seam peak RSS <= 200 MB, seam time <= 2x plain.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bridges.manifest_tools import ManifestTools, manifest_tool_validator
from sidecar import Location, ToolContext

MiB = 1024 * 1024
PRODUCER = (
    "import sys\n"
    "size = int(sys.argv[1])\n"
    "block = ((b'0123456789abcdef' * 4)[:-1] + b'\\n') * 16384\n"
    "write = sys.stdout.buffer.write\n"
    "for _ in range(size // len(block)):\n"
    "    write(block)\n"
    "write(block[: size % len(block)])\n"
)
"""Writes `size` bytes of 64-byte text lines to stdout in 1 MiB blocks."""


def producer(size: int) -> list[str]:
    return [sys.executable, "-c", PRODUCER, str(size)]


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def through_seam(base: Path, size: int) -> tuple[float, float, float, str, float]:
    """(seconds, peak RSS MB, RSS MB before, ref, the daemon's CPU seconds in the call)."""
    root = base / "root"
    root.mkdir()
    async with Location.open(
        root, state_dir=base / "state", store_quota_bytes=4 * size + 64 * MiB,
        entry_point_plugins=False,
    ) as location:
        raw = {
            "kind": "command",
            "description": "produce a lot of output",
            "input": {"type": "object", "properties": {}},
            "argv": producer(size),
            "timeout": 600,
            "max_output_bytes": size + MiB,
        }
        config, problems = manifest_tool_validator(location.root)("bench", "$.tools.big", raw)
        assert config is not None, problems
        async with ManifestTools(
            location.tools, location.seam.store, location.root, location.permissions,
            store_namespace=location.name,
        ) as tools:
            await tools.apply({"big": config})
            before = current_rss_mb()
            reset_peak()
            start = time.perf_counter()
            cpu = time.process_time()
            outcome = await location.snapshot().execute(
                "big", {}, ToolContext(session_id="s", agent="bench", message_id="m", call_id="c")
            )
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu
            peak = peak_rss_mb()
    assert outcome.status == "completed", outcome.error
    assert outcome.metadata is not None
    stored = outcome.metadata["stdout"]["size_bytes"]
    assert stored == size, (stored, size)
    return elapsed, peak, before, outcome.metadata["stdout"]["ref"], cpu


def plain(base: Path, size: int) -> float:
    target = base / "plain.out"
    start = time.perf_counter()
    with target.open("wb") as out:
        subprocess.run(producer(size), stdout=out, check=True)
        os.fsync(out.fileno())
    elapsed = time.perf_counter() - start
    assert target.stat().st_size == size
    target.unlink()
    return elapsed


def dd(source: Path, base: Path, size: int) -> float:
    """dd copying the same bytes (prepared in `source`, on tmpfs) to a file, with fsync."""
    target = base / "dd.out"
    start = time.perf_counter()
    subprocess.run(
        ["dd", f"if={source}", f"of={target}", "bs=1M", "conv=fsync"],
        check=True, capture_output=True,
    )
    elapsed = time.perf_counter() - start
    assert target.stat().st_size == size
    target.unlink()
    return elapsed


def same_bytes(size: int) -> Path:
    """The producer's output in a file on /dev/shm (memory), as dd's input."""
    fd, name = tempfile.mkstemp(prefix="bench-command-", dir="/dev/shm")
    with os.fdopen(fd, "wb") as out:
        subprocess.run(producer(size), stdout=out, check=True)
    return Path(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    parser.add_argument("--uvloop", action="store_true")
    options = parser.parse_args()
    size = options.size_mib * MiB
    base = Path(tempfile.mkdtemp(prefix="bench-command-", dir=options.dir))
    runner = asyncio.run
    if options.uvloop:
        import uvloop

        runner = uvloop.run
    source = same_bytes(size)
    try:
        # Baselines before and after the seam run; the best of each is the one compared to,
        # so disk writeback noise can only make the seam look worse.
        plain_s = [plain(base, size)]
        dd_s = [dd(source, base, size)]
        seam_s, seam_peak, before, ref, seam_cpu = runner(through_seam(base, size))
        plain_s.append(plain(base, size))
        dd_s.append(dd(source, base, size))
    finally:
        shutil.rmtree(base, ignore_errors=True)
        source.unlink()
    best_plain, best_dd = min(plain_s), min(dd_s)
    print(f"command output through the seam: {size / MiB:,.0f} MiB ({sys.platform}, "
          f"{'uvloop' if options.uvloop else 'asyncio'}), retained as {ref}")
    print(f"{'path':<34}{'time s':>9}{'MiB/s':>9}{'peak RSS MB':>13}")
    print(f"{'seam (command tool, spooled)':<34}{seam_s:>9.2f}{size / MiB / seam_s:>9.0f}"
          f"{seam_peak:>13.1f}   daemon CPU {seam_cpu:.2f} s (all its threads)")
    print(f"{'plain (same producer > file)':<34}{best_plain:>9.2f}"
          f"{size / MiB / best_plain:>9.0f}{'-':>13}   runs: "
          + ", ".join(f"{t:.2f}" for t in plain_s))
    print(f"{'dd same bytes (conv=fsync)':<34}{best_dd:>9.2f}{size / MiB / best_dd:>9.0f}"
          f"{'-':>13}   runs: " + ", ".join(f"{t:.2f}" for t in dd_s))
    print(f"baseline: the best plain write; seam/plain = {seam_s / best_plain:.2f}x "
          f"(target <= 2x), seam/dd = {seam_s / best_dd:.2f}x; peak RSS {seam_peak:.1f} MB "
          f"with {before:.1f} MB before the call (target <= 200 MB)")


if __name__ == "__main__":
    main()
