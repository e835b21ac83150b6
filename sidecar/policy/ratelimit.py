"""Rate limits: calls per minute (a token bucket) and calls at once, per profile and per tool
(`RateLimits`, whose docstring holds the manifest keys and what a refused call gets).

Imports `sidecar.model` and `sidecar.registry`. Exports `RateLimit` and `RateLimits`.
"""

from __future__ import annotations

import fnmatch
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.tool import CallContext, tool_with
from sidecar.registry.registry import Entry


@dataclass(frozen=True, slots=True)
class RateLimit:
    calls_per_minute: int | None = None
    burst: int | None = None
    concurrency: int | None = None


@dataclass(slots=True)
class _Limiter:
    """One bucket and one concurrency counter."""

    label: str
    limit: RateLimit
    tokens: float = 0.0
    stamp: float = 0.0
    running: int = 0
    rejected: int = 0

    @property
    def capacity(self) -> float:
        return float(self.limit.burst or self.limit.calls_per_minute or 0)

    def refill(self, now: float) -> None:
        rate = (self.limit.calls_per_minute or 0) / 60.0
        # `now` may predate `stamp` by the instant between a call reading the clock and its
        # bucket being made: a negative refill left a 1-call bucket just short of one token
        elapsed = max(0.0, now - self.stamp)
        self.tokens = min(self.capacity, self.tokens + elapsed * rate)
        self.stamp = now

    def refusal(self, now: float) -> str | None:
        if self.limit.concurrency is not None and self.running >= self.limit.concurrency:
            return (f"{self.label} has {self.running} call(s) running, at most "
                    f"{self.limit.concurrency} at once; retry when one has finished")
        if self.limit.calls_per_minute is None:
            return None
        self.refill(now)
        if self.tokens >= 1.0:
            return None
        wait = (1.0 - self.tokens) * 60.0 / self.limit.calls_per_minute
        return (f"{self.label} allows {self.limit.calls_per_minute} calls per minute; retry "
                f"in {math.ceil(wait * 10) / 10:g} s")


@dataclass(slots=True)
class RateLimits:
    """Every limit of a Location: `set` them from the manifests; `reshape_profile` wraps a
    profile's tools (the `sidecar.registry.profiles.Profiles` wrapper).

        [rate_limits."web_*"]                   # each matching tool its own limit, every profile
        calls_per_minute = 30                   # refilled evenly; `burst` (default the same)
        concurrency = 2                         # caps the calls running at once
        [profiles.research.rate_limit]          # the whole profile together
        calls_per_minute = 120
        [profiles.research.tool_rate_limits."web_fetch"]   # a tool, in that profile only
        calls_per_minute = 10

    A call that would go over a limit does not run: it fails `unavailable` with a message
    that says which limit and when to retry (`Rate limit ... retry in 2.5 s`). Nothing is
    taken from any bucket unless every limit of the call allows it. `rejected` counts
    refusals by limit, for `/metrics` (`sidecar_rate_limited_total{limit}`). Code Mode's
    nested calls go through the same wrapped tools, so they count too."""

    per_tool: Mapping[str, RateLimit] = field(default_factory=dict)
    per_profile: Mapping[str, RateLimit] = field(default_factory=dict)
    per_profile_tool: Mapping[str, Mapping[str, RateLimit]] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    _limiters: dict[str, _Limiter] = field(default_factory=dict)

    def set(
        self, per_tool: Mapping[str, RateLimit], per_profile: Mapping[str, RateLimit],
        per_profile_tool: Mapping[str, Mapping[str, RateLimit]],
    ) -> None:
        """New limits (a manifest load); a limiter whose limit is unchanged keeps its state."""
        self.per_tool, self.per_profile = dict(per_tool), dict(per_profile)
        self.per_profile_tool = {k: dict(v) for k, v in per_profile_tool.items() if v}

    @property
    def rejected(self) -> dict[str, int]:
        return {key: lim.rejected for key, lim in self._limiters.items() if lim.rejected}

    def _limiter(self, key: str, label: str, limit: RateLimit) -> _Limiter:
        found = self._limiters.get(key)
        if found is None or found.limit != limit:
            found = self._limiters[key] = _Limiter(label, limit, stamp=self.clock())
            found.tokens = found.capacity
        return found

    def _for(self, profile: str, name: str) -> list[tuple[str, str, RateLimit]]:
        limits: list[tuple[str, str, RateLimit]] = []
        for glob, limit in self.per_tool.items():
            if fnmatch.fnmatchcase(name, glob):
                limits.append((f"tool:{name}", f"tool {name}", limit))
                break
        for glob, limit in self.per_profile_tool.get(profile, {}).items():
            if fnmatch.fnmatchcase(name, glob):
                limits.append((f"profile:{profile}:tool:{name}",
                               f"tool {name} in profile {profile}", limit))
                break
        whole = self.per_profile.get(profile)
        if whole is not None:
            limits.append((f"profile:{profile}", f"profile {profile}", whole))
        return limits

    def reshape_profile(self, profile: str, entries: Mapping[str, Entry]) -> Mapping[str, Entry]:
        if not (self.per_tool or self.per_profile or self.per_profile_tool):
            return entries
        result: dict[str, Entry] = {}
        for name, entry in entries.items():
            limits = self._for(profile, name)
            if not limits:
                result[name] = entry
                continue
            result[name] = Entry(tool_with(entry.tool, execute=self._limited(entry, limits)),
                                 entry.key, entry.definition, entry.origin)
        return result

    def _limited(self, entry: Entry, limits: list[tuple[str, str, RateLimit]]) -> Any:
        inner = entry.tool.execute

        async def execute(value: Any, ctx: CallContext) -> Any:
            now = self.clock()
            limiters = [self._limiter(key, label, limit) for key, label, limit in limits]
            for limiter in limiters:
                refusal = limiter.refusal(now)
                if refusal is not None:
                    limiter.rejected += 1
                    raise ToolFailure(f"Rate limit: {refusal}.", kind=ErrorKind.UNAVAILABLE)
            for limiter in limiters:
                if limiter.limit.calls_per_minute is not None:
                    limiter.tokens -= 1.0
                limiter.running += 1
            try:
                return await inner(value, ctx)
            finally:
                for limiter in limiters:
                    limiter.running -= 1

        return execute
