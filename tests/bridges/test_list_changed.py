"""tools/list_changed in both protocol eras and over stdio, streamable HTTP and SSE: a debounced
re-list replaces the server's registration in place."""

from __future__ import annotations

import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from sidecar import Location, TextContent, Tool, ToolResponse
from tests.bridges.helpers import HttpServers, ctx, eventually, legacy, stdio

pytestmark = pytest.mark.anyio

ERAS = {"auto": "2026-07-28", "legacy": "2025-11-25"}


async def _plugin(arguments: object, context: object) -> ToolResponse:
    return ToolResponse(content="from the plugin")


@pytest.mark.parametrize(
    ("transport", "protocol"),
    [("stdio", "auto"), ("stdio", "legacy"), ("http", "auto"), ("http", "legacy"),
     ("sse", "legacy")],
)
async def test_list_changed_replaces_the_registration_in_place(
    location: Location, http_servers: HttpServers, transport: str, protocol: str
) -> None:
    if transport == "stdio":
        config = stdio(protocol=protocol)
    else:
        url, _ = await http_servers.launch_testserver(transport)
        config = ServerConfig(url=url, type=transport, protocol=protocol)
    changed: list[str] = []
    async with ServerPool({"t": config}, location.tools, on_tools_changed=changed.append) as pool:
        assert pool.health()["t"].protocol_version == ERAS[protocol]
        plugin = Tool(description="registered after the server", input={"type": "object"},
                      execute=_plugin)
        async with location.tools.register({"t_extra": plugin}, label="plugin"):
            announced = len(changed)
            outcome = await location.snapshot().execute(
                "t_mutate", {"add": ["extra", "more"], "remove": ["fail"]}, ctx()
            )
            assert outcome.content == (TextContent("mutated"),)
            await eventually(lambda: "t_more" in location.snapshot().names,
                             what="the re-list after list_changed")
            names = location.snapshot().names
            assert "t_fail" not in names
            assert len(changed) > announced and set(changed) == {"t"}
            assert pool.health()["t"].tool_count == 16 + 2 - 1
            # replaced in place: the plugin registered later still wins the shared name
            shadowed = await location.snapshot().execute("t_extra", {}, ctx())
            assert shadowed.content == (TextContent("from the plugin"),)
            added = await location.snapshot().execute("t_more", {}, ctx())
            assert added.status == "completed"
        unshadowed = await location.snapshot().execute("t_extra", {}, ctx())
        assert unshadowed.status == "completed"
        assert unshadowed.content != (TextContent("from the plugin"),)


async def test_a_plain_2025_server_is_reached_through_the_auto_probe(location: Location) -> None:
    servers = {
        "auto": legacy(),  # answers server/discover with -32601: auto falls back at once
        "pinned": legacy("--ignore-unknown", protocol="legacy"),  # never answers the probe
    }
    async with ServerPool(servers, location.tools) as pool:
        health = pool.health()
        assert health["auto"].protocol_version == "2025-06-18"
        assert health["pinned"].protocol_version == "2025-06-18"
        for key in servers:
            outcome = await location.snapshot().execute(f"{key}_echo", {"text": key}, ctx())
            assert outcome.content == (TextContent(key),)
