"""Published servers from the registries, installed by scripts/bootstrap-servers into .deps/:
@modelcontextprotocol/server-everything (npm; stdio, and streamableHttp on 127.0.0.1 only) and
mcp-server-time (PyPI, its own venv)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from sidecar import ImageContent, Location, TextContent
from sidecar.model.events import CallProgress
from tests.bridges.helpers import (
    LOOPBACK_PRELOAD,
    HttpServers,
    child_env,
    ctx,
    eventually,
    free_port,
)

pytestmark = pytest.mark.anyio

EVERYTHING = "npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
ONE_MB = 1_000_000


async def test_server_everything_over_stdio(location: Location, published_servers: Path) -> None:
    config = ServerConfig(command="node", args=[str(published_servers / EVERYTHING), "stdio"])
    changed: list[str] = []
    async with (
        ServerPool({"ev": config}, location.tools, on_tools_changed=changed.append) as pool,
        location.events.subscribe() as subscription,
    ):
        health = pool.health()["ev"]
        assert health.state == "ready", health.last_error
        assert health.tool_count >= 10 and not health.skipped
        # it announces tools/list_changed after initialize: re-listed, replaced in place
        await eventually(lambda: len(changed) >= 2, what="the re-list after list_changed")
        snapshot = location.snapshot()

        echo = await snapshot.execute("ev_echo", {"message": "m" * ONE_MB}, ctx())
        assert echo.status == "completed", echo.error
        (preview,) = echo.content
        assert isinstance(preview, TextContent) and preview.text.startswith("Echo: mmm")
        (retained,) = echo.managed
        assert retained.size_bytes == len("Echo: ") + ONE_MB

        image = await snapshot.execute("ev_get-tiny-image", {}, ctx())
        images = [c for c in image.content if isinstance(c, ImageContent)]
        assert len(images) == 1 and images[0].mime_type == "image/png"

        structured = await snapshot.execute(
            "ev_get-structured-content", {"location": "Chicago"}, ctx()
        )
        assert structured.status == "completed", structured.error
        assert set(structured.output) >= {"temperature", "conditions", "humidity"}
        definition = {d.name: d for d in snapshot.definitions}["ev_get-structured-content"]
        assert definition.output_schema is not None

        longer = await snapshot.execute(
            "ev_trigger-long-running-operation", {"duration": 1, "steps": 3}, ctx()
        )
        assert longer.status == "completed", longer.error
        progress = []
        while not subscription.queue.empty():
            event = subscription.queue.get_nowait()
            if isinstance(event, CallProgress) and event.tool.endswith("long-running-operation"):
                progress.append(event.snapshot["progress"])
        assert progress == [1, 2, 3]


async def test_server_everything_streamable_http_on_loopback(
    location: Location, published_servers: Path, http_servers: HttpServers
) -> None:
    # It binds every interface and has no host option: a preload makes its listen() use
    # 127.0.0.1 (see servers/loopback.mjs).
    port = free_port()
    proc = http_servers.start(
        ["node", "--import", str(LOOPBACK_PRELOAD), str(published_servers / EVERYTHING),
         "streamableHttp"],
        env=child_env(PORT=str(port)),
    )

    def listening() -> list[str]:
        try:
            conns = psutil.Process(proc.pid).net_connections(kind="inet")
        except psutil.NoSuchProcess:
            return []
        return [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN]

    addresses = await eventually(listening, what="server-everything to listen")
    assert addresses == ["127.0.0.1"]
    config = ServerConfig(url=f"http://127.0.0.1:{port}/mcp")
    async with ServerPool({"ev": config}, location.tools) as pool:
        assert pool.health()["ev"].state == "ready", pool.health()["ev"].last_error
        snapshot = location.snapshot()
        echo = await snapshot.execute("ev_echo", {"message": "over http"}, ctx())
        assert echo.content == (TextContent("Echo: over http"),)
        total = await snapshot.execute("ev_get-sum", {"a": 2, "b": 40}, ctx())
        assert total.status == "completed" and "42" in str(total.content)
        structured = await snapshot.execute(
            "ev_get-structured-content", {"location": "New York"}, ctx()
        )
        assert structured.status == "completed" and "temperature" in structured.output


async def test_mcp_server_time(location: Location, published_servers: Path) -> None:
    python = published_servers / "venv-time/bin/python"
    config = ServerConfig(command=str(python),
                          args=["-m", "mcp_server_time", "--local-timezone", "UTC"])
    async with ServerPool({"time": config}, location.tools) as pool:
        assert pool.health()["time"].state == "ready", pool.health()["time"].last_error
        snapshot = location.snapshot()
        now = await snapshot.execute("time_get_current_time", {"timezone": "UTC"}, ctx())
        assert now.status == "completed", now.error
        assert now.output["timezone"] == "UTC"
        converted = await snapshot.execute(
            "time_convert_time",
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
            ctx(),
        )
        assert converted.status == "completed", converted.error
        assert converted.output["target"]["datetime"].endswith("21:00:00+09:00")
        bad = await snapshot.execute("time_get_current_time", {}, ctx())
        assert bad.error is not None and bad.error.path == "$"
