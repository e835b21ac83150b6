"""MCP Apps (SEP-1865) through `sidecar serve` `/mcp`, with real upstreams: the published
`@modelcontextprotocol/server-basic-vanillajs` (node, stdio; `scripts/bootstrap-servers`) and
`servers/apps_server.py` serving the same `ui://` URI (once in the handshake era, once at
2026-07-28). The mcp Python client in both eras: UI URIs stay `ui://` and agree between tools
and resources, the two Views stay distinct, `structuredContent` of a tool without
`outputSchema` passes, the gateway advertises the extension and upstreams see it, and a View's
call by its server's own tool name arrives."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.extension import advertise
from mcp.client.streamable_http import streamable_http_client

from tests.hardening.daemon_process import Daemon, serving
from tests.serve.mcp_facade.test_http import raw_call

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
BASIC = (ROOT / ".deps/apps/node_modules/@modelcontextprotocol/server-basic-vanillajs/dist"
         / "index.js")
APPS = Path(__file__).resolve().parent / "servers" / "apps_server.py"
MIME = "text/html;profile=mcp-app"
UI = "io.modelcontextprotocol/ui"
LISTED = {"basic_get-time", "charts_chart", "charts26_chart"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the daemon under test is its own process with its own loop


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    if not BASIC.exists() or shutil.which("node") is None:
        pytest.fail("server-basic-vanillajs is missing: run scripts/bootstrap-servers")
    base = tmp_path_factory.mktemp("apps")
    servers: dict[str, Any] = {
        "basic": {"command": "node", "args": [str(BASIC), "--stdio"]},
        "charts": {"command": sys.executable, "args": [str(APPS)], "protocol": "legacy"},
        "charts26": {"command": sys.executable, "args": [str(APPS)],
                     "protocol": "2026-07-28"},
    }
    (base / "manifests").mkdir()
    (base / "manifests" / "servers.json").write_text(json.dumps({"mcpServers": servers}))
    with serving(base / "state", manifests=base / "manifests") as running:
        yield running


@asynccontextmanager
async def connect(daemon: Daemon, mode: str, **kwargs: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {daemon.token}"},
                                  timeout=httpx2.Timeout(60)) as http, \
            Client(streamable_http_client(f"{daemon.url}/mcp", http_client=http), mode=mode,
                   cache=None, **kwargs) as client:
        for _ in range(600):  # the upstream servers start in the background: up to 60 s
            if LISTED <= {t.name for t in (await client.list_tools()).tools}:
                break
            await anyio.sleep(0.1)
        else:
            pytest.fail(f"the daemon never listed {sorted(LISTED)}")
        yield client


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_ui_resources_stay_ui_and_distinct_across_servers(daemon: Daemon, mode: str) -> None:
    async with connect(daemon, mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        basic, charts = tools["basic_get-time"].meta, tools["charts_chart"].meta
        assert basic is not None and charts is not None
        assert basic["ui"]["resourceUri"] == "ui://basic/get-time/mcp-app.html"
        assert basic["ui/resourceUri"] == "ui://basic/get-time/mcp-app.html"
        assert charts["ui"]["resourceUri"] == "ui://charts/get-time/mcp-app.html"
        assert charts["ui/resourceUri"] == "ui://charts/get-time/mcp-app.html"

        listed = {str(r.uri) for r in (await client.list_resources()).resources}
        assert {"ui://basic/get-time/mcp-app.html",
                "ui://charts/get-time/mcp-app.html"} <= listed

        page = (await client.read_resource(basic["ui"]["resourceUri"])).contents[0]
        assert isinstance(page, types.TextResourceContents)
        assert page.mime_type == MIME and str(page.uri) == basic["ui"]["resourceUri"]
        assert len(page.text.encode()) > 200_000 and page.text.lstrip().startswith("<")
        other = (await client.read_resource(charts["ui"]["resourceUri"])).contents[0]
        assert isinstance(other, types.TextResourceContents)
        assert "charts view" in other.text and other.mime_type == MIME

        chart = await raw_call(client, "charts_chart", {})
        assert not chart.is_error
        assert chart.structured_content == {"points": [{"x": 1, "y": 2}, {"x": 2, "y": 3},
                                                       {"x": 3, "y": 5}]}
        assert chart.content[0].text == "3 points"
        timed = await raw_call(client, "basic_get-time", {})
        assert timed.structured_content is not None and "time" in timed.structured_content


async def test_extension_negotiated_both_ways_and_view_calls_arrive(daemon: Daemon) -> None:
    async with connect(daemon, "auto") as client:  # server/discover: 2026-07-28
        capabilities = client.session.server_capabilities
        assert capabilities is not None and UI in (capabilities.extensions or {})
    for mode in ("legacy", "2026-07-28"):
        async with connect(daemon, mode, extensions=[advertise(UI, {"mimeTypes": [MIME]})]
                           ) as client:
            # a 2025-era upstream: the gateway's own connection declared MCP Apps
            seen = await raw_call(client, "charts_ui_declared", {})
            assert MIME in seen.content[0].text
            # a 2026-07-28 upstream hears the caller's capabilities with each request
            seen = await raw_call(client, "charts26_ui_declared", {})
            assert MIME in seen.content[0].text
            # A View calls its own server's tools by their own names; its host relays them
            # unchanged. A name only one server has reaches it; one two servers have does not.
            view = await raw_call(client, "get-time", {})
            assert not view.is_error and view.structured_content is not None
            ambiguous = await raw_call(client, "chart", {})
            assert ambiguous.is_error and "chart" in ambiguous.content[0].text
    async with connect(daemon, "2026-07-28") as client:  # a client without MCP Apps
        seen = await raw_call(client, "charts26_ui_declared", {})
        assert seen.content[0].text == "None"
