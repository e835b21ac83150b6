"""OpenTelemetry spans of a call through the seam to a real upstream over stdio and HTTP: the
call span and its steps, `traceparent` sent to the server in `_meta`, a client's trace
continued. The SDK's in-memory exporter collects the spans (tests/serve/test_otlp_export.py
sends them to a real OTLP receiver)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bridges.manifest.loading import AnnotationPermissions
from bridges.mcp import ServerPool
from sidecar import Location
from sidecar.model import tracing
from tests.bridges.helpers import ctx, eventually, read_events, stdio

pytestmark = pytest.mark.anyio


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans of this process's daemon code, in memory. The provider is the daemon's own
    (`tracing.use_provider`), not OpenTelemetry's global one: the `mcp` SDK's instrumentation
    caches the global one's tracers, and a global provider set here would go on stamping
    `_meta` of every later SDK client request in the test run."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in finished}


async def test_a_call_is_one_span_with_its_steps(
    location: Location, events: Path, spans: InMemorySpanExporter
) -> None:
    async with ServerPool({"t": stdio(events=events)}, location.tools):
        outcome = await location.snapshot().execute("t_echo", {"text": "hi"}, ctx())
        assert outcome.status == "completed"
        call = await eventually(lambda: read_events(events, "call"), what="the call event")
    named = by_name(spans.get_finished_spans())
    root = named["execute_tool t_echo"]
    assert root.parent is None
    assert root.attributes is not None
    assert root.attributes["gen_ai.tool.name"] == "t_echo"
    assert root.attributes["gen_ai.tool.call.id"] == outcome.call_id
    assert root.attributes["sidecar.status"] == "completed"
    assert root.attributes["sidecar.bytes_out"] == 2
    for step in ("validate_input", "tools/call echo", "bound_content", "record_outcome"):
        assert named[step].parent is not None, step
        assert named[step].parent.span_id == root.context.span_id, step
        assert named[step].context.trace_id == root.context.trace_id
    upstream = named["tools/call echo"]
    assert upstream.kind == trace.SpanKind.CLIENT
    # the server got the upstream span's context in `_meta`
    traceparent = call[0]["meta"]["traceparent"]
    assert traceparent.split("-")[1] == format(root.context.trace_id, "032x")
    assert traceparent.split("-")[2] == format(upstream.context.span_id, "016x")


async def test_an_error_sets_the_span_status_and_error_type(
    location: Location, spans: InMemorySpanExporter
) -> None:
    outcome = await location.snapshot().execute("nope", {}, ctx())
    assert outcome.status == "error"
    root = by_name(spans.get_finished_spans())["execute_tool nope"]
    assert root.attributes is not None and root.attributes["error.type"] == "unknown_tool"
    assert root.status.status_code == trace.StatusCode.ERROR


async def test_a_client_trace_is_continued(
    location: Location, spans: InMemorySpanExporter
) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracing.continued({"traceparent": parent, "other": "ignored"}):
        await location.snapshot().execute("managed_read", {"ref": "m_missing"}, ctx())
    root = by_name(spans.get_finished_spans())["execute_tool managed_read"]
    assert format(root.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert root.parent is not None and format(root.parent.span_id, "016x") == "b7ad6b7169203331"


async def test_a_permission_wait_is_a_step(
    location: Location, events: Path, spans: InMemorySpanExporter
) -> None:
    config = stdio(events=events, permissions=AnnotationPermissions(default="ask"))
    async with ServerPool({"t": config}, location.tools, permissions=location.permissions):
        snapshot = location.snapshot()
        call = asyncio.create_task(snapshot.execute("t_echo", {"text": "ok?"}, ctx()))
        asked = await eventually(location.permissions.pending, what="the ask")
        await location.permissions.reply(asked[0].id, "once")
        assert (await call).status == "completed"
    named = by_name(spans.get_finished_spans())
    wait = named["permission_wait"]
    assert wait.parent is not None
    assert wait.parent.span_id == named["execute_tool t_echo"].context.span_id


def test_tracing_is_off_without_a_provider_or_settings() -> None:
    assert not tracing.enabled()
    assert tracing.configure_from_env({}) is False
    assert tracing.configure_from_env({"OTEL_TRACES_EXPORTER": "none"}) is False
    carrier: dict[str, str] = {}
    tracing.inject_into(carrier)
    assert carrier == {}
