"""The last hour of this daemon's calls, a minute at a time, for the console's plots:
`MinuteRing` keeps at most `MINUTES` per-minute aggregates (calls, errors by kind, a latency
histogram per tool, the managed store's size) and the trace ids of recent calls. It is a seam
observer (`observe`, a few dictionary updates per call: no I/O, nothing awaited); the store's
size is sampled once a minute by `sample_store`.

Imports `sidecar.model`. Exports `MinuteRing`, `Minute`, `MINUTES`, `LATENCY_BOUNDS_MS`,
`MAX_TOOLS` and `quantile`.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from sidecar.model import tracing
from sidecar.model.outcome import Outcome

MINUTES = 60
LATENCY_BOUNDS_MS = tuple(round(0.1 * 1.25 ** i, 4) for i in range(64))
"""Upper bounds of the latency buckets (0.1 ms to ~160 s, 25 % apart: a quantile read off
them is within 25 % of the true one)."""
MAX_TOOLS = 100
"""Tools with a latency histogram of their own in one minute; later ones count as `other`."""
TRACE_IDS = 10_000
"""Recent calls whose trace id is remembered (only while tracing is on)."""
SAMPLE_SECONDS = 60.0


@dataclass(slots=True)
class Minute:
    start: int
    """Epoch seconds of the minute's start."""
    calls: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latency: dict[str, list[int]] = field(default_factory=dict)
    """Per tool: a count per `LATENCY_BOUNDS_MS` bucket (one more for anything slower)."""
    store_bytes: int | None = None


def quantile(counts: list[int], q: float) -> float | None:
    """The `q` quantile (0-1) of a bucket histogram, as its bucket's upper bound in ms."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank and n:
            return LATENCY_BOUNDS_MS[min(i, len(LATENCY_BOUNDS_MS) - 1)]
    return LATENCY_BOUNDS_MS[-1]


class MinuteRing:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._minutes: list[Minute] = []
        self._now: Minute | None = None
        self.trace_ids: OrderedDict[str, str] = OrderedDict()

    def _minute(self) -> Minute:
        start = int(self._clock()) // 60 * 60
        now = self._now
        if now is None or now.start != start:
            now = Minute(start)
            self._minutes.append(now)
            del self._minutes[:-MINUTES]
            self._now = now
        return now

    def observe(self, outcome: Outcome, seconds: float) -> None:
        """The seam's observer: one settled call."""
        minute = self._minute()
        minute.calls += 1
        if outcome.error is not None:
            kind = outcome.error.kind.value
            minute.errors[kind] = minute.errors.get(kind, 0) + 1
        tool = outcome.tool
        counts = minute.latency.get(tool)
        if counts is None:
            if len(minute.latency) >= MAX_TOOLS:
                tool = "other"
            counts = minute.latency.setdefault(tool, [0] * (len(LATENCY_BOUNDS_MS) + 1))
        counts[bisect.bisect_left(LATENCY_BOUNDS_MS, seconds * 1000)] += 1
        if tracing.enabled():
            self._keep_trace_id(outcome.call_id)

    def _keep_trace_id(self, call_id: str) -> None:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            self.trace_ids[call_id] = format(context.trace_id, "032x")
            while len(self.trace_ids) > TRACE_IDS:
                self.trace_ids.popitem(last=False)

    def sample_store(self, size_bytes: int) -> None:
        self._minute().store_bytes = size_bytes

    async def sample_forever(self, stats: Callable[[], Awaitable[Any]]) -> None:
        """Sample the managed store's size (`stats().bytes`) now and once a minute."""
        while True:
            try:
                self.sample_store(int((await stats()).bytes))
            except Exception:  # a fleet store that does not answer: a gap in the plot
                pass
            await asyncio.sleep(SAMPLE_SECONDS)

    def hour(self) -> list[Minute]:
        """The last `MINUTES` minutes, oldest first, a minute without calls included (empty)."""
        end = int(self._clock()) // 60 * 60
        kept = {m.start: m for m in self._minutes}
        return [kept.get(start) or Minute(start)
                for start in range(end - (MINUTES - 1) * 60, end + 1, 60)]
