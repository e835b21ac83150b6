"""Calls through the seam to a real server: content, output, errors, progress, output
validation modes and permission defaults (over streamable HTTP, one shared server), timeouts and
cancellation (over stdio). Mapping results does not depend on the transport."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from sidecar import (
    AudioContent,
    ImageContent,
    Location,
    ResourceContent,
    ResourceLink,
    TextContent,
)
from sidecar.model.errors import ErrorKind
from sidecar.model.events import CallProgress
from tests.bridges.helpers import SharedServer, ctx, eventually, read_events, stdio

pytestmark = pytest.mark.anyio


async def test_results_map_to_content_output_and_errors(
    location: Location, shared_http_server: SharedServer
) -> None:
    events = shared_http_server.events
    config = ServerConfig(url=shared_http_server.url)
    async with (
        ServerPool({"t": config}, location.tools) as pool,
        location.events.subscribe() as subscription,
    ):
        snapshot = location.snapshot()

        echo = await snapshot.execute("t_echo", {"text": "hello"}, ctx())
        assert echo.status == "completed"
        assert echo.content == (TextContent("hello"),)
        assert echo.output is None and echo.metadata is None

        add = await snapshot.execute("t_add", {"a": 2, "b": 40}, ctx())
        assert add.output == {"sum": 42}
        assert add.content == (TextContent("42"),)

        only = await snapshot.execute("t_structured_only", {"x": 7}, ctx())
        assert only.output == {"sum": 7}
        assert only.content == (TextContent('{"sum":7}'),)  # derived once by the seam

        plain = await snapshot.execute("t_plain_structured", {}, ctx())
        assert plain.output is None
        assert plain.content == (TextContent('{"answer":42}'),)

        media = await snapshot.execute("t_media", {}, ctx())
        assert media.status == "completed"
        kinds = [type(item) for item in media.content]
        assert kinds == [TextContent, ImageContent, AudioContent, ResourceContent,
                         ResourceContent, ResourceLink]
        image = media.content[1]
        assert isinstance(image, ImageContent) and image.mime_type == "image/png"
        assert media.content[3] == ResourceContent(
            uri="test://doc", mime_type="text/plain", text="embedded text"
        )
        assert media.content[4] == ResourceContent(
            uri="test://bin", mime_type="application/octet-stream", blob="AAE="
        )
        assert media.content[5] == ResourceLink(
            uri="test://link", name="link", description="a link", mime_type="text/plain"
        )

        failed = await snapshot.execute("t_fail", {}, ctx())
        assert failed.status == "error"
        assert failed.error is not None
        assert failed.error.kind is ErrorKind.TOOL_FAILURE
        assert failed.error.message == "it failed"

        rpc = await snapshot.execute("t_rpc_error", {}, ctx())
        assert rpc.error is not None and rpc.error.kind is ErrorKind.UPSTREAM
        assert "'t'" in rpc.error.message and "'rpc_error'" in rpc.error.message

        # strict output validation: a result that breaks its outputSchema never succeeds
        bad = await snapshot.execute("t_bad_output", {}, ctx())
        assert bad.error is not None and bad.error.kind is ErrorKind.INVALID_OUTPUT
        assert bad.error.path == "$.sum"

        # our input validation runs first: the server never sees an invalid call
        calls_before = len(read_events(events, "call"))
        invalid = await snapshot.execute("t_add", {"a": 1, "b": "two"}, ctx())
        assert invalid.error is not None and invalid.error.kind is ErrorKind.INVALID_INPUT
        assert invalid.error.path == "$.b"
        assert len(read_events(events, "call")) == calls_before

        # progress and log notifications during a call become its progress snapshots
        while not subscription.queue.empty():
            subscription.queue.get_nowait()
        progressed = await snapshot.execute("t_progress", {"steps": 3}, ctx())
        assert progressed.status == "completed"
        snapshots = []
        while not subscription.queue.empty():
            event = subscription.queue.get_nowait()
            if isinstance(event, CallProgress):
                snapshots.append(event.snapshot)
        assert pool.health()["t"].last_call_latency_ms is not None
    progress = [s for s in snapshots if "progress" in s]
    assert [s["progress"] for s in progress][-1] == 3
    assert progress[-1]["total"] == 3 and progress[-1]["server"] == "t"
    logs = [s["log"] for s in snapshots if "log" in s]
    assert logs and logs[-1]["message"] == "log line 3" and logs[-1]["level"] == "info"


async def test_output_validation_warn_passes_with_a_warning_and_off_passes_silently(
    location: Location, caplog: pytest.LogCaptureFixture, shared_http_server: SharedServer
) -> None:
    url = shared_http_server.url
    servers = {"w": ServerConfig(url=url, output_validation="warn"),
               "o": ServerConfig(url=url, output_validation="off")}
    with caplog.at_level(logging.WARNING, logger="bridges.mcp"):
        async with ServerPool(servers, location.tools):
            snapshot = location.snapshot()
            warned = await snapshot.execute("w_bad_output", {}, ctx())
            off = await snapshot.execute("o_bad_output", {}, ctx())
    assert warned.status == off.status == "completed"
    assert warned.output == off.output == {"sum": "not a number"}
    warnings = [r.getMessage() for r in caplog.records if "outputSchema" in r.getMessage()]
    assert len(warnings) == 1 and "'w'" in warnings[0] and "'bad_output'" in warnings[0]


async def test_timeouts_and_our_cancellation_cancel_the_upstream_request(
    location: Location, events: Path
) -> None:
    config = stdio(events=events, timeouts={"call": 0.5})
    async with ServerPool({"t": config}, location.tools):
        outcome = await location.snapshot().execute(
            "t_slow", {"seconds": 20, "tag": "timed-out"}, ctx()
        )
        assert outcome.error is not None and outcome.error.kind is ErrorKind.TIMEOUT
        assert "'t'" in outcome.error.message and "'slow'" in outcome.error.message
        await eventually(lambda: read_events(events, "cancelled"), what="upstream cancel")
        # the partial snapshot keeps the last progress the call reported
        assert outcome.partial is not None and outcome.partial.get("tool") == "slow"
        # the connection is still good
        again = await location.snapshot().execute("t_echo", {"text": "still here"}, ctx())
        assert again.content == (TextContent("still here"),)

        # cancelling our call (asyncio) cancels the upstream request and propagates
        task = asyncio.ensure_future(
            location.snapshot().execute("t_slow", {"seconds": 20, "tag": "ours"}, ctx())
        )
        await eventually(lambda: len(read_events(events, "slow-start")) == 2,
                         what="the call to start")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await eventually(lambda: len(read_events(events, "cancelled")) == 2,
                         what="upstream cancel of our call")
    assert [e["tag"] for e in read_events(events, "cancelled")] == ["timed-out", "ours"]
    assert not read_events(events, "slow-done")


async def test_permission_defaults_come_from_annotations(
    location: Location, shared_http_server: SharedServer
) -> None:
    config = ServerConfig(url=shared_http_server.url,
                          permissions={"destructive": "deny", "read_only": "allow"})
    async with ServerPool({"t": config}, location.tools, permissions=location.permissions):
        snapshot = location.snapshot()
        denied = await snapshot.execute("t_crash", {}, ctx())  # destructive_hint: denied
        allowed = await snapshot.execute("t_echo", {"text": "ok"}, ctx())  # read_only_hint
    assert denied.error is not None and denied.error.kind is ErrorKind.DENIED
    assert allowed.status == "completed"
