"""The timing loops the bench scripts share: one async call, made sequentially, then by
concurrent callers. Latencies in milliseconds, rates in calls per second.

    stats = {**await sequential(one, 500), **await concurrent(one, 16, 60)}

`one(label)` makes one call; labels are unique per call (`s7`, `c3-12`), e.g. for call ids.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

Call = Callable[[str], Awaitable[Any]]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def sequential(one: Call, count: int, into: list[float] | None = None) -> dict[str, float]:
    """`into`: where each call's latency (seconds) is appended as well."""
    lat: list[float] = [] if into is None else into
    first = len(lat)
    t0 = time.perf_counter()
    for i in range(count):
        s = time.perf_counter()
        await one(f"s{i}")
        lat.append(time.perf_counter() - s)
    took = time.perf_counter() - t0
    mine = lat[first:]
    return {"seq_rate": count / took, "seq_p50": pct(mine, 0.5) * 1e3,
            "seq_p99": pct(mine, 0.99) * 1e3, "seq_seconds": took}


async def concurrent(
    one: Call, tasks: int, per_task: int, into: list[float] | None = None
) -> dict[str, float]:
    """`into`: as for `sequential`."""
    lat: list[float] = [] if into is None else into
    first = len(lat)

    async def worker(k: int) -> None:
        for i in range(per_task):
            s = time.perf_counter()
            await one(f"c{k}-{i}")
            lat.append(time.perf_counter() - s)

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for k in range(tasks):
            group.create_task(worker(k))
    took = time.perf_counter() - t0
    mine = lat[first:]
    return {"conc_rate": tasks * per_task / took, "conc_p50": pct(mine, 0.5) * 1e3,
            "conc_p99": pct(mine, 0.99) * 1e3, "conc_seconds": took}
