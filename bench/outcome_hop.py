"""Bench: what one durable outcome record costs, with the writer thread warm and after idling.

    .venv/bin/python bench/outcome_hop.py [--records 600] [--gaps 0,1,4]

A bridged call records its outcome through `SqliteOutcomeLog.record`: a hop to the writer
thread, one SQLite insert (WAL, `synchronous=NORMAL`), a hop back. Between sequential calls
that thread sleeps for as long as the call takes elsewhere (3-5 ms through a stdio bridge).
For each gap (ms slept before each record) this prints the median of:

- `record`: the round trip of `SqliteOutcomeLog.record` on an event loop;
- `insert`: the same insert, on this thread, on a connection of its own (CPU time);
- `insert, warmed`: the same after ~100 us of other work on this thread since waking (as on an
  event loop that has just handled the upstream's answer): what committing inline would cost;
- `syscalls`: two no-op syscalls (`getppid`) on this thread (CPU time): the machine's own
  price of waking up, with no SQLite in it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sidecar.content import TextContent
from sidecar.outcome import Outcome
from sidecar.outcome_log import _SCHEMA, SqliteOutcomeLog
from sidecar.tool import ToolContext


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def cpu_us(fn: Callable[[int], object], count: int, gap: float, warm: float = 0.0) -> float:
    spent = []
    for i in range(count):
        if gap:
            time.sleep(gap)
        if warm:
            busy(warm)
        start = time.thread_time()
        fn(i)
        spent.append(time.thread_time() - start)
    return statistics.median(spent) * 1e6


async def record_us(log: SqliteOutcomeLog, count: int, gap: float, tag: str) -> float:
    spent = []
    for i in range(count):
        if gap:
            await asyncio.sleep(gap)
        ctx = ToolContext(session_id="s", agent="a", message_id="m", call_id=f"{tag}-{i}")
        outcome = Outcome(ctx.call_id, "up_echo", "completed", content=(TextContent("hi"),))
        start = time.perf_counter()
        await log.record("bench", outcome, ctx)
        spent.append(time.perf_counter() - start)
    return statistics.median(spent) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=600)
    parser.add_argument("--gaps", default="0,1,4", help="ms slept before each record")
    opts = parser.parse_args()
    gaps = [float(g) / 1000 for g in opts.gaps.split(",")]
    body = json.dumps({"call_id": "x", "status": "completed",
                       "content": [{"type": "text", "text": "hi"}]})
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "direct.db", isolation_level=None)
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "wal_autocheckpoint=0"):
            db.execute(f"PRAGMA {pragma}")
        db.executescript(_SCHEMA)

        def insert(i: int) -> None:
            db.execute("INSERT OR IGNORE INTO outcomes VALUES (?,?,?,?,?,?,?,?,?)",
                       ("bench", f"{time.time_ns()}-{i}", "s", "a", "m", "up_echo",
                        "completed", body, time.time()))

        async def records() -> list[float]:
            log = await SqliteOutcomeLog.open(Path(tmp) / "outcomes.db")
            try:
                return [await record_us(log, opts.records, gap, f"g{gap}") for gap in gaps]
            finally:
                await log.aclose()

        recorded = asyncio.run(records())
        print(f"outcome record, median of {opts.records} (python {sys.version.split()[0]}, "
              f"sqlite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs)")
        print(f"{'gap ms':>7} {'record us':>10} {'insert cpu us':>14} "
              f"{'insert, warmed cpu us':>22} {'2 syscalls cpu us':>18}")
        for gap, record in zip(gaps, recorded, strict=True):
            ins = cpu_us(insert, opts.records, gap)
            warmed = cpu_us(insert, opts.records, gap, warm=100e-6)
            calls = cpu_us(lambda _: (os.getppid(), os.getppid()), opts.records, gap)
            print(f"{gap * 1000:>7g} {record:>10.0f} {ins:>14.1f} {warmed:>22.1f} {calls:>18.1f}")
        db.close()


if __name__ == "__main__":
    main()
