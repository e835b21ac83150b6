"""Per-user quotas (`[auth.quotas]`, `[auth.quotas.users.NAME]`): calls per minute, calls
running at once, snapshots and bytes in the managed store, per signed-in user (an identity
provider's token, or a scoped token of a user); the all-access token is not counted.

Two doors, one book (`UserQuotas`): the HTTP API asks `refusal(...)` before a call or a
snapshot (429 `quota`, nothing runs); every tool served is wrapped (`reshape_profile`), so a
call through `/mcp` or Code Mode counts too and fails `unavailable` with the same `Quota: ...`
message, naming the limit and the user. `store_bytes` is the managed store's own limit for
`user:NAME` (set on each manifest load; the seam fails an output over it and tells
`store_refused`); this book reads the bytes each user holds (`read_store`). `collect` exports
the `sidecar_user_*` gauges and `sidecar_quota_refused_total{user,limit}` for /metrics.

Imports `sidecar.model`, `sidecar.registry`, `managed_store`. Exports `UserQuotas`.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from managed_store import ManagedStoreError
from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.tool import CallContext, tool_with
from sidecar.registry.registry import Entry

if TYPE_CHECKING:
    from bridges.manifest.auth import QuotaConfig, QuotaLimits

WINDOW = 60.0
USER_OWNER = "user:"
"""How a signed-in user's calls name their owner in the managed store."""
log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Usage:
    calls: deque[float] = field(default_factory=deque)
    running: int = 0
    snapshots: deque[float] = field(default_factory=deque)


class UserQuotas(Collector):
    def __init__(self, config: Callable[[], QuotaConfig | None],
                 snapshot_seconds: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic,
                 store_usage: Callable[[], Awaitable[Mapping[str, tuple[int, int]]]]
                 | None = None) -> None:
        """`store_usage`: the managed store's (bytes held, limit) per owner with a limit."""
        self._config = config
        self._snapshot_seconds = snapshot_seconds
        self._clock = clock
        self._store_usage = store_usage
        self._usage: dict[str, _Usage] = {}
        self._stored: dict[str, tuple[int, int]] = {}
        self.refused: dict[tuple[str, str], int] = {}

    async def read_store(self) -> None:
        """Read the bytes each user holds in the managed store against `store_bytes` (kept
        for `usage` and `collect`); a store that cannot answer keeps the last reading."""
        if self._store_usage is None:
            return
        try:
            found = await self._store_usage()
        except ManagedStoreError as exc:
            log.warning("bytes per user in the managed store could not be read: %s", exc)
            return
        self._stored = {owner.removeprefix(USER_OWNER): held for owner, held in found.items()
                        if owner.startswith(USER_OWNER)}

    def _limits(self, user: str) -> QuotaLimits | None:
        config = self._config()
        return config.for_user(user) if config is not None else None

    def _use(self, user: str, now: float) -> _Usage:
        usage = self._usage.setdefault(user, _Usage())
        while usage.calls and usage.calls[0] <= now - WINDOW:
            usage.calls.popleft()
        ttl = self._snapshot_seconds()
        while usage.snapshots and usage.snapshots[0] <= now - ttl:
            usage.snapshots.popleft()
        return usage

    def refusal(self, user: str | None, what: str) -> str | None:
        """Why `user` may not start a `call` or make a `snapshot` now (None: within quota);
        nothing is counted."""
        if user is None:
            return None
        limits = self._limits(user)
        if limits is None:
            return None
        now = self._clock()
        usage = self._use(user, now)
        found = self._over(user, limits, usage, what, now)
        if found is not None:
            limit, message = found
            self.refused[(user, limit)] = self.refused.get((user, limit), 0) + 1
            return message
        return None

    def _over(self, user: str, limits: QuotaLimits, usage: _Usage, what: str,
              now: float) -> tuple[str, str] | None:
        if what == "snapshot":
            if limits.snapshots is not None and len(usage.snapshots) >= limits.snapshots:
                wait = self._wait(usage.snapshots[0], now, self._snapshot_seconds())
                return "snapshots", (
                    f"Quota: {user} may hold {limits.snapshots} snapshots (quota snapshots); "
                    f"the oldest expires in {wait:g} s")
            return None
        if limits.concurrent_calls is not None and usage.running >= limits.concurrent_calls:
            return "concurrent_calls", (
                f"Quota: {user} has {usage.running} call(s) running, at most "
                f"{limits.concurrent_calls} at once (quota concurrent_calls); retry when one "
                f"has finished")
        if limits.calls_per_minute is not None and len(usage.calls) >= limits.calls_per_minute:
            return "calls_per_minute", (
                f"Quota: {user} may make {limits.calls_per_minute} calls per minute (quota "
                f"calls_per_minute); retry in {self._wait(usage.calls[0], now, WINDOW):g} s")
        return None

    @staticmethod
    def _wait(oldest: float, now: float, window: float) -> float:
        return max(0.1, math.ceil((oldest + window - now) * 10) / 10)

    def usage(self) -> dict[str, dict[str, Any]]:
        """Each counted user's use and limits (the console's quota table); bytes in the
        managed store as of the last `read_store`."""
        now = self._clock()
        shown: dict[str, dict[str, Any]] = {}
        for user in sorted({*self._usage, *self._stored}):
            usage, limits = self._use(user, now), self._limits(user)
            if limits is None:
                continue
            held, _ = self._stored.get(user, (0, None))
            shown[user] = {
                "calls_per_minute": (len(usage.calls), limits.calls_per_minute),
                "concurrent_calls": (usage.running, limits.concurrent_calls),
                "snapshots": (len(usage.snapshots), limits.snapshots),
                "store_bytes": (held, limits.store_bytes)}
        return shown

    def store_refused(self, owner: str) -> None:
        """The managed store refused `owner`'s output over its `store_bytes` (the seam's
        `limit_refusals`): counted as the other refusals."""
        if owner.startswith("user:"):
            key = (owner[5:], "store_bytes")
            self.refused[key] = self.refused.get(key, 0) + 1

    def snapshot_made(self, user: str | None) -> None:
        if user is not None and self._limits(user) is not None:
            now = self._clock()
            self._use(user, now).snapshots.append(now)

    def reshape_profile(self, profile: str, entries: Mapping[str, Entry]) -> Mapping[str, Entry]:
        """Every tool counted against its caller's quota (a `Profiles` wrapper); unchanged
        without `[auth.quotas]` (a manifest load recomputes the served entries), so a daemon
        without quotas pays nothing on its calls."""
        if self._config() is None:
            return entries
        return {name: Entry(tool_with(entry.tool, execute=self._counted(entry.tool.execute)),
                            entry.key, entry.definition, entry.origin)
                for name, entry in entries.items()}

    def _counted(self, inner: Any) -> Any:
        async def execute(value: Any, ctx: CallContext) -> Any:
            owner = ctx.runner.owner
            if owner is None or not owner.startswith("user:"):
                return await inner(value, ctx)
            user = owner[5:]
            refusal = self.refusal(user, "call")
            if refusal is not None:
                raise ToolFailure(refusal, kind=ErrorKind.UNAVAILABLE)
            limits = self._limits(user)
            if limits is None:
                return await inner(value, ctx)
            now = self._clock()
            usage = self._use(user, now)
            usage.calls.append(now)
            usage.running += 1
            try:
                return await inner(value, ctx)
            finally:
                usage.running -= 1

        return execute

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily("sidecar_user_calls_running",
                                    "Calls running per signed-in user", labels=["user"])
        snapshots = GaugeMetricFamily("sidecar_user_snapshots",
                                      "Snapshots counted against each user's quota",
                                      labels=["user"])
        now = self._clock()
        for user in list(self._usage):
            usage = self._use(user, now)
            running.add_metric([user], usage.running)
            snapshots.add_metric([user], len(usage.snapshots))
        stored = GaugeMetricFamily("sidecar_user_store_bytes",
                                 "Bytes each user holds in the managed store (quota store_bytes)",
                                 labels=["user"])
        stored_limit = GaugeMetricFamily("sidecar_user_store_bytes_limit",
                                         "Each user's store_bytes quota", labels=["user"])
        for user, (nbytes, most) in dict(self._stored).items():
            stored.add_metric([user], nbytes)
            stored_limit.add_metric([user], most)
        refused = CounterMetricFamily("sidecar_quota_refused",
                                      "Calls and snapshots refused by a user's quota",
                                      labels=["user", "limit"])
        for (user, limit), count in dict(self.refused).items():
            refused.add_metric([user, limit], count)
        yield running
        yield snapshots
        yield stored
        yield stored_limit
        yield refused
