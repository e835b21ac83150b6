"""Prometheus metrics of one daemon, on a private registry (`GET /metrics`): `Metrics`, whose
docstring lists every metric.

Imports `sidecar.model`, `sidecar.stores` and `managed_store`. Exports `Metrics`,
`CONTENT_TYPE` and `MAX_LABELSETS`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, cast

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from managed_store import StagedStats
from sidecar.model.content import TextContent
from sidecar.model.outcome import Outcome
from sidecar.stores.call_history import CallRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_LABELSETS = 500
_MAX_CACHED = 4 * MAX_LABELSETS
"""Label values whose children `Metrics` keeps at hand (past that, `labels()` finds them)."""
_SIZE_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)
_go_float = cast("Callable[[float], str]", floatToGoString)  # untyped: a bucket's `le`
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                    10, 30, 60, 300)
_DURATION_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10, 60, 300)


class Metrics:
    """The daemon's metrics:

    - `sidecar_calls_total{tool,status,error_kind}` and `sidecar_call_seconds{tool}`
      (histogram)
    - `sidecar_call_duration_seconds{tool,server}`, `sidecar_call_input_bytes{tool,server}`,
      `sidecar_call_output_bytes{tool,server}` (histograms from the call history's rows; at
      most `MAX_LABELSETS` (tool, server) pairs, later ones counted under `tool="other"`)
    - `sidecar_text_bytes_total{kind="bounded"|"retained"}`: model-facing text after
      bounding, and text retained whole in the managed store
    - `sidecar_store_objects`, `sidecar_store_bytes`: managed store usage (read at scrape
      time)
    - `sidecar_store_staged_objects`, `sidecar_store_staged_bytes`,
      `sidecar_store_staged_oldest_seconds`: objects this replica committed and has not
      uploaded yet (only for a store writing behind: `SIDECAR_OBJECT_STORE`)
    - `sidecar_upstream_restarts{server}`, `sidecar_upstream_up{server}`: from server health
    - `sidecar_state_bytes{part}`: the state directory's size by part
      (`sidecar.location.state_usage`)
    - `sidecar_rate_limited_total{limit}`: calls refused by a rate limit (`tool:NAME`,
      `profile:NAME`, `profile:NAME:tool:NAME`)
    - `sidecar_guardrail_decisions_total{stage,decision,rule}`: guardrail decisions since
      start (`sidecar.policy.guardrails`: rule `secrets` or `hook`)
    - `sidecar_tool_definition_tokens{profile}`: tokens (cl100k_base) of the definitions each
      profile serves (`sidecar.serve.tool_tokens`; read at scrape time)
    - `sidecar_outcomes_stored`, `sidecar_outcomes_expired` (tombstones of pruned outcomes);
      counters since start: `sidecar_outcomes_pruned_total`,
      `sidecar_store_evicted_total{reason="expired"|"quota"}`, `sidecar_wal_truncations_total`
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # The per-call metrics are plain counts kept on the event loop and exported at scrape
        # time (`_Family`): prometheus_client's children take a lock per increment and walk
        # their buckets in Python, ~10 µs a call in all (2026-12-06).
        self.calls = _Family("sidecar_calls", "Calls settled by the seam",
                             ("tool", "status", "error_kind"))
        self.latency = _Family("sidecar_call_seconds", "Seam call duration", ("tool",),
                               _LATENCY_BUCKETS)
        self.text_bytes = _Family("sidecar_text_bytes",
                                  "Text bytes bounded for models and retained whole", ("kind",))
        self.store_objects = Gauge(
            "sidecar_store_objects", "Objects in the managed store", registry=self.registry
        )
        self.store_bytes = Gauge(
            "sidecar_store_bytes", "Bytes in the managed store", registry=self.registry
        )
        self.restarts = Gauge(
            "sidecar_upstream_restarts", "Restarts of an upstream server", ["server"],
            registry=self.registry,
        )
        self.up = Gauge(
            "sidecar_upstream_up", "1 when an upstream server is ready", ["server"],
            registry=self.registry,
        )

        self.state = _StateCollector()
        self.registry.register(self.state)
        self.rate_limited = _RateLimitCollector()
        self.registry.register(self.rate_limited)
        self.staged = _StagedCollector()
        self.registry.register(self.staged)
        self.definition_tokens = _DefinitionTokensCollector()
        self.registry.register(self.definition_tokens)
        self.guardrails = _GuardrailCollector()
        self.registry.register(self.guardrails)

        self.call_duration = _Family(
            "sidecar_call_duration_seconds", "Call duration by tool and server",
            ("tool", "server"), _DURATION_BUCKETS)
        self.input_bytes = _Family(
            "sidecar_call_input_bytes", "Input size (JSON bytes) by tool and server",
            ("tool", "server"), _SIZE_BUCKETS)
        self.output_bytes = _Family(
            "sidecar_call_output_bytes", "Model-visible text bytes by tool and server",
            ("tool", "server"), _SIZE_BUCKETS)
        for family in (self.calls, self.latency, self.text_bytes, self.call_duration,
                       self.input_bytes, self.output_bytes):
            self.registry.register(family)
        self._labelsets: set[tuple[str, str]] = set()
        # The children of a history row's (tool, server), past `MAX_LABELSETS` those of
        # `other`: at most `_MAX_CACHED` entries.
        self._by_server: dict[tuple[str, str], tuple[_Child, _Child, _Child]] = {}
        self._bounded = self.text_bytes.labels("bounded")
        self._retained = self.text_bytes.labels("retained")

    def observe_record(self, record: CallRecord) -> None:
        """A settled call's history row (replays are not counted again)."""
        if record.replayed:
            return
        key = labels = (record.tool, record.server or "")
        children = self._by_server.get(key)
        if children is None:
            if labels not in self._labelsets:
                if len(self._labelsets) >= MAX_LABELSETS:
                    labels = ("other", "other")
                else:
                    self._labelsets.add(labels)
            children = (self.call_duration.labels(*labels), self.input_bytes.labels(*labels),
                        self.output_bytes.labels(*labels))
            if len(self._by_server) < _MAX_CACHED:
                self._by_server[key] = children
        duration, input_bytes, output_bytes = children
        duration.observe(record.duration_ms / 1000)
        input_bytes.observe(record.input_bytes)
        output_bytes.observe(record.content_bytes)

    def observe(self, outcome: Outcome, seconds: float) -> None:
        kind = outcome.error.kind.value if outcome.error is not None else ""
        self.calls.labels(outcome.tool, outcome.status, kind).inc()
        self.latency.labels(outcome.tool).observe(seconds)
        shown = sum(len(i.text.encode()) for i in outcome.content if isinstance(i, TextContent))
        if shown:
            self._bounded.inc(shown)
        for managed in outcome.managed:
            self._retained.inc(managed.size_bytes)

    async def render(
        self,
        store_stats: Callable[[], Awaitable[Any]],
        servers: Mapping[str, Mapping[str, Any]],
        state: Mapping[str, Any] | None = None,
        rate_limited: Mapping[str, int] | None = None,
        definition_tokens: Mapping[str, int] | None = None,
        guardrail_decisions: Mapping[tuple[str, str, str], int] | None = None,
    ) -> bytes:
        """`state` is the health report's `state` section (`sidecar.location.state_usage`);
        `rate_limited` its calls refused by each rate limit (`sidecar.policy.ratelimit`);
        `definition_tokens` the tokens of each profile's definitions; `guardrail_decisions`
        the guardrails' decisions by (stage, decision, rule)."""
        self.state.report = state
        self.rate_limited.counts = rate_limited or {}
        self.definition_tokens.totals = definition_tokens or {}
        self.guardrails.counts = guardrail_decisions or {}
        stats = await store_stats()
        self.store_objects.set(stats.count)
        self.store_bytes.set(stats.bytes)
        self.staged.stats = getattr(stats, "staged", None)
        for name, health in servers.items():
            self.restarts.labels(name).set(health.get("restarts", 0))
            self.up.labels(name).set(1 if health.get("state") == "ready" else 0)
        return generate_latest(self.registry)


class _RateLimitCollector(Collector):
    """`sidecar_rate_limited_total{limit}`: calls refused by each rate limit since start."""

    def __init__(self) -> None:
        self.counts: Mapping[str, int] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("sidecar_rate_limited", "Calls refused by a rate limit",
                                     labels=["limit"])
        for limit, count in self.counts.items():
            family.add_metric([limit], count)
        yield family


class _GuardrailCollector(Collector):
    """`sidecar_guardrail_decisions_total{stage,decision,rule}`, counted by the guardrails."""

    def __init__(self) -> None:
        self.counts: Mapping[tuple[str, str, str], int] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("sidecar_guardrail_decisions",
                                     "Guardrail decisions on call inputs and outputs",
                                     labels=["stage", "decision", "rule"])
        for labels, count in dict(self.counts).items():
            family.add_metric(list(labels), count)
        yield family


class _DefinitionTokensCollector(Collector):
    """`sidecar_tool_definition_tokens{profile}`: a profile that is gone is not exported."""

    def __init__(self) -> None:
        self.totals: Mapping[str, int] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("sidecar_tool_definition_tokens",
                                   "Tokens (cl100k_base) of the tool definitions a profile "
                                   "serves", labels=["profile"])
        for profile, tokens in self.totals.items():
            family.add_metric([profile], tokens)
        yield family


class _StagedCollector(Collector):
    """What a store writing behind staged here and has not uploaded (`StoreStats.staged`);
    nothing for a store that does not stage."""

    def __init__(self) -> None:
        self.stats: StagedStats | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        staged = self.stats
        if staged is None:
            return
        yield GaugeMetricFamily("sidecar_store_staged_objects",
                                "Objects committed here and not uploaded yet",
                                value=staged.objects)
        yield GaugeMetricFamily("sidecar_store_staged_bytes",
                                "Bytes committed here and not uploaded yet", value=staged.bytes)
        yield GaugeMetricFamily("sidecar_store_staged_oldest_seconds",
                                "Seconds since the oldest object not uploaded yet was committed",
                                value=staged.oldest_seconds)


class _StateCollector(Collector):
    """The state directory's sizes and the upkeep counters, read from the last report: these
    are totals kept by the stores, so they are exported as they are, not incremented here."""

    def __init__(self) -> None:
        self.report: Mapping[str, Any] | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        report = self.report
        if not report:
            return
        sizes = GaugeMetricFamily("sidecar_state_bytes", "State directory bytes by part",
                                  labels=["part"])
        for part, size in report.get("bytes", {}).items():
            sizes.add_metric([part], size)
        yield sizes
        upkeep = report.get("upkeep", {})
        for name, key, doc in (
            ("sidecar_outcomes_stored", "outcomes_stored", "Outcomes in the outcome log"),
            ("sidecar_outcomes_expired", "outcomes_expired",
             "Tombstones of pruned outcomes (their call ids replay as expired)"),
        ):
            if key in upkeep:
                yield GaugeMetricFamily(name, doc, value=upkeep[key])
        if "outcomes_pruned" in upkeep:
            yield CounterMetricFamily("sidecar_outcomes_pruned", "Outcomes pruned since start",
                                      value=upkeep["outcomes_pruned"])
        if "wal_truncations" in upkeep:
            yield CounterMetricFamily("sidecar_wal_truncations",
                                      "Outcome log WAL truncations since start",
                                      value=upkeep["wal_truncations"])
        evicted = CounterMetricFamily("sidecar_store_evicted",
                                      "Managed objects evicted since start", labels=["reason"])
        evicted.add_metric(["expired"], upkeep.get("managed_evicted_expired", 0))
        evicted.add_metric(["quota"], upkeep.get("managed_evicted_quota", 0))
        yield evicted


class _Child:
    """One label set's count (a counter: `inc`) or histogram (`observe`: the bucket found by
    bisection, `le` as Prometheus counts it, and the sum)."""

    __slots__ = ("bounds", "buckets", "created", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total: float = 0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        self.total += amount

    def observe(self, amount: float) -> None:
        self.buckets[bisect_left(self.bounds, amount)] += 1
        self.total += amount


class _Family(Collector):
    """A counter (no `buckets`) or a histogram with labels, counted on the event loop's
    thread and exported by `collect` as prometheus_client's own would be (`_total`, or
    `_bucket`/`_count`/`_sum`)."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...],
                 buckets: tuple[float, ...] = ()) -> None:
        self._name, self._doc, self._labels, self._bounds = name, documentation, labels, buckets
        self._les = [_go_float(b) for b in buckets] + ["+Inf"]
        self._children: dict[tuple[str, ...], _Child] = {}

    def labels(self, *values: str) -> _Child:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _Child(self._bounds)
        return child

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        children = list(self._children.items())
        if not self._bounds:
            counter = CounterMetricFamily(self._name, self._doc, labels=self._labels)
            for values, child in children:
                counter.add_metric(values, child.total, created=child.created)
            yield counter
            return
        histogram = HistogramMetricFamily(self._name, self._doc, labels=self._labels)
        for values, child in children:
            cumulative: list[tuple[str, float]] = []
            running = 0
            for le, count in zip(self._les, list(child.buckets), strict=True):
                running += count
                cumulative.append((le, float(running)))
            histogram.add_metric(values, cumulative, child.total)
        yield histogram
