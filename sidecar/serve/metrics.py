"""Prometheus metrics of one daemon, on a private registry (`GET /metrics`).

- `sidecar_calls_total{tool,status,error_kind}` and `sidecar_call_seconds{tool}` (histogram)
- `sidecar_text_bytes_total{kind="bounded"|"retained"}`: model-facing text after bounding,
  and text retained whole in the managed store
- `sidecar_store_objects`, `sidecar_store_bytes`: managed store usage (read at scrape time)
- `sidecar_upstream_restarts{server}`, `sidecar_upstream_up{server}`: from server health
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sidecar.content import TextContent
from sidecar.outcome import Outcome

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.calls = Counter(
            "sidecar_calls", "Calls settled by the seam", ["tool", "status", "error_kind"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "sidecar_call_seconds", "Seam call duration", ["tool"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                     5, 10, 30, 60, 300),
        )
        self.text_bytes = Counter(
            "sidecar_text_bytes", "Text bytes bounded for models and retained whole", ["kind"],
            registry=self.registry,
        )
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

    def observe(self, outcome: Outcome, seconds: float) -> None:
        kind = outcome.error.kind.value if outcome.error is not None else ""
        self.calls.labels(outcome.tool, outcome.status, kind).inc()
        self.latency.labels(outcome.tool).observe(seconds)
        shown = sum(len(i.text.encode()) for i in outcome.content if isinstance(i, TextContent))
        if shown:
            self.text_bytes.labels("bounded").inc(shown)
        for managed in outcome.managed:
            self.text_bytes.labels("retained").inc(managed.size_bytes)

    async def render(
        self,
        store_stats: Callable[[], Awaitable[Any]],
        servers: Mapping[str, Mapping[str, Any]],
    ) -> bytes:
        stats = await store_stats()
        self.store_objects.set(stats.count)
        self.store_bytes.set(stats.bytes)
        for name, health in servers.items():
            self.restarts.labels(name).set(health.get("restarts", 0))
            self.up.labels(name).set(1 if health.get("state") == "ready" else 0)
        return generate_latest(self.registry)
