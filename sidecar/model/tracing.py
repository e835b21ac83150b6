"""OpenTelemetry traces of calls: one span per call through the seam (`execute_tool NAME`) with
child spans for its steps (`validate_input`, `permission_wait`, `tools/call NAME`,
`bound_content`, `record_outcome`); the tree and its attributes are in docs/observability.md.
Depends on `opentelemetry-api` only; imports nothing of ours.

Exports `step`, `continued`, `inject_into`, `describe_outcome`, `tracer`, `enabled`,
`refresh`, `use_provider`, `configure_from_env` and `shutdown`. Tracing is off, and costs one
flag test per call, until a tracer provider is configured: by an application that embeds
`Location.open` (before opening it, or calling `refresh()` after), by `use_provider`, or by
`configure_from_env()` (the CLI calls it). Attributes follow the GenAI and MCP semantic
conventions where they exist (`gen_ai.tool.name`, `mcp.session.id`, `error.type`, ...) and
use `sidecar.*` for the rest.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import (
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
)

log = logging.getLogger("sidecar.tracing")

TRACER_NAME = "mcp-sidecar"
_NOOP_PROVIDERS = (ProxyTracerProvider, NoOpTracerProvider)


_own_provider: trace.TracerProvider | None = None
_enabled = False
"""Resolved by `refresh`: asking OpenTelemetry for its global provider reads `os.environ` three
times, which cost every call ~1 µs (2026-12-04); the answer changes only when a provider is
installed, so it is resolved then and at `Location.open`."""
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


def use_provider(provider: trace.TracerProvider | None) -> None:
    """Record the daemon's spans with `provider` instead of OpenTelemetry's global one (None:
    the global one again). For tests and embedders that must not install a global provider:
    the global one is also what the `mcp` SDK's own instrumentation uses."""
    global _own_provider
    _own_provider = provider
    refresh()


def refresh() -> bool:
    """Look again whether a real tracer provider is installed (`Location.open` does; an
    application that installs OpenTelemetry's global provider after opening a Location calls
    it). Returns `enabled()`."""
    global _enabled
    _enabled = _own_provider is not None or not isinstance(trace.get_tracer_provider(),
                                                           _NOOP_PROVIDERS)
    return _enabled


def enabled() -> bool:
    """True when a real tracer provider is installed (spans are then recorded), as last
    resolved by `refresh`."""
    return _enabled


def tracer() -> trace.Tracer:
    if _own_provider is not None:
        return _own_provider.get_tracer(TRACER_NAME)
    return trace.get_tracer(TRACER_NAME)


def configure_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Install the SDK's tracer provider when the `OTEL_*` variables ask for traces.

    With `OTEL_TRACES_EXPORTER` (`otlp`, `console`; `none` or `OTEL_SDK_DISABLED=true`: off)
    or an `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set, it installs
    the SDK's provider with a batch processor and the OTLP/HTTP exporter (`pip install
    'mcp-sidecar[otel]'`); the exporter reads its own `OTEL_EXPORTER_OTLP_*` settings and
    `OTEL_SERVICE_NAME` names the service (default `mcp-sidecar`).

    Returns True when tracing is on afterwards. Never raises: a missing SDK or a bad setting
    is logged and tracing stays off.
    """
    env = os.environ if environ is None else environ
    if refresh():
        return True
    exporter_name = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT")
    if exporter_name == "none" or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if not exporter_name and not endpoint:
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        log.warning("OTEL_* variables ask for traces but the OpenTelemetry SDK is not "
                    "installed: pip install 'mcp-sidecar[otel]'")
        return False
    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTLP trace export needs opentelemetry-exporter-otlp-proto-http: "
                        "pip install 'mcp-sidecar[otel]'")
            return False
        exporter = OTLPSpanExporter()
    service = env.get("OTEL_SERVICE_NAME") or "mcp-sidecar"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    refresh()
    log.info("traces are exported (%s)", exporter_name or "otlp")
    return True


def shutdown() -> None:
    """Flush and stop the provider `configure_from_env` installed (at daemon exit)."""
    provider = trace.get_tracer_provider()
    stop = getattr(provider, "shutdown", None)
    if callable(stop):
        with contextlib.suppress(Exception):
            stop()


def continued(carrier: Mapping[str, Any] | None) -> contextlib.AbstractContextManager[None]:
    """Make a client's W3C trace context (`traceparent`, `tracestate` keys, from an MCP
    request's `_meta` or the HTTP headers of `/v1` and `/mcp`) the current context, so the
    spans started inside are its children. A no-op without one."""
    if not carrier or not _enabled:
        return _OFF
    return _continued(carrier)


@contextlib.contextmanager
def _continued(carrier: Mapping[str, Any]) -> Iterator[None]:
    headers = {k: v for k, v in carrier.items()
               if k in ("traceparent", "tracestate") and isinstance(v, str)}
    if "traceparent" not in headers:
        yield
        return
    token = otel_context.attach(extract(headers))
    try:
        yield
    finally:
        otel_context.detach(token)


def inject_into(carrier: MutableMapping[str, Any]) -> None:
    """Add the current span's `traceparent` (and `tracestate`) to an outgoing `_meta` or
    header mapping; nothing when tracing is off."""
    if enabled():
        inject(carrier)


def describe_outcome(span: Span, outcome: Any) -> None:
    """Set the call span's result attributes from an `Outcome`."""
    shown = sum(len(getattr(i, "text", "").encode()) for i in outcome.content)
    span.set_attribute("sidecar.status", outcome.status)
    span.set_attribute("sidecar.bytes_out", shown)
    span.set_attribute("sidecar.retained_bytes", sum(m.size_bytes for m in outcome.managed))
    span.set_attribute("sidecar.replayed", bool(outcome.replayed))
    if outcome.error is not None:
        span.set_attribute("error.type", outcome.error.kind.value)
        span.set_status(Status(StatusCode.ERROR, outcome.error.message[:200]))


def step(name: str, kind: SpanKind = SpanKind.INTERNAL,
         attributes: Mapping[str, Any] | None = None
         ) -> contextlib.AbstractContextManager[Span | None]:
    """A child span of the current one, or (tracing off) a shared no-op context."""
    if not _enabled:
        return _OFF
    return tracer().start_as_current_span(name, kind=kind, attributes=attributes)
