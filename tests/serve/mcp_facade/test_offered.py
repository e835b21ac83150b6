"""What /mcp offers follows its upstream servers (`offered`): the capabilities of `initialize`
and `server/discover`, and the `ttlMs`/`cacheScope` of merged listings, before and after a
reload; `tools/list` in name order; SSE streams open with a priming event (`stream_priming`).
Real upstream servers (`servers/offer_server.py`, `servers/conformance_fixture.py`) over stdio
behind a live uvicorn."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest

from tests.serve.mcp_facade.conftest import TOKEN, Served, fixture_server, serving
from tests.serve.mcp_facade.test_http import connect

pytestmark = pytest.mark.anyio
OFFER = Path(__file__).resolve().parent / "servers" / "offer_server.py"
ERAS = ["legacy", "2026-07-28"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the daemon's loop


def offer(protocol: str, namespace: str, **offered: Any) -> dict[str, object]:
    return {"command": sys.executable, "args": [str(OFFER), json.dumps(offered)],
            "namespace": namespace, "protocol": protocol}


async def listed(served: Served, *names: str) -> list[str]:
    """The facade's tool names once every one of `names` is listed (servers start in the
    background)."""
    with anyio.fail_after(30):
        while True:
            async with connect(served.url, "legacy") as client:
                found = [t.name for t in (await client.list_tools()).tools]
            if set(names) <= set(found):
                return found
            await anyio.sleep(0.1)


async def capabilities(served: Served, mode: str) -> types.ServerCapabilities:
    async with connect(served.url, mode) as client:
        if mode == "legacy":
            return client.server_capabilities  # of `initialize`
        raw = await client.session.send_discover(mode)  # what `server/discover` answers
        return types.DiscoverResult.model_validate(raw).capabilities


async def reload(served: Served, servers: dict[str, object]) -> None:
    manifest = Path(served.location.root) / "manifests" / "servers.json"
    manifest.write_text(json.dumps({"mcpServers": servers}))
    assert await served.location.reload_manifests()


async def test_capabilities_follow_what_the_upstreams_offer(tmp_path: Path) -> None:
    plain = {"plain": offer("legacy", "p", tool="plain_tool")}
    async with serving(tmp_path, plain) as served:
        await listed(served, "p_plain_tool")
        for mode in ERAS:
            caps = await capabilities(served, mode)
            assert caps.tools is not None, mode  # the daemon's own tools: always
            assert caps.resources is None and caps.prompts is None, (mode, caps)
            assert caps.completions is None and caps.logging is None, (mode, caps)
        full = offer("legacy", "f", tool="full_tool", prompts=[0, "private"],
                     resources=[0, "private"], completions=True, logging=True)
        await reload(served, {**plain, "full": full})
        await listed(served, "p_plain_tool", "f_full_tool")
        legacy = await capabilities(served, "legacy")
        assert legacy.resources is not None and legacy.resources.subscribe, legacy
        assert legacy.resources.list_changed and legacy.prompts is not None, legacy
        assert legacy.completions is not None and legacy.logging is not None, legacy
        modern = await capabilities(served, "2026-07-28")
        assert modern.resources is not None and modern.prompts is not None, modern
        assert modern.completions is not None, modern
        await reload(served, plain)  # and gone again with the server that offered them
        with anyio.fail_after(30):
            while True:
                if (await capabilities(served, "legacy")).prompts is None:
                    break
                await anyio.sleep(0.1)


async def test_list_cache_hints_come_from_the_upstreams_and_reset_on_reload(
    tmp_path: Path
) -> None:
    a = offer("auto", "a", tool="zeta", tools=[50000, "public"], prompts=[60000, "public"],
              resources=[30000, "public"], templates=[45000, "private"])
    b = offer("auto", "b", tool="alpha", tools=[40000, "private"], prompts=[20000, "public"])
    async with serving(tmp_path, {"a": a, "b": b}) as served:
        names = await listed(served, "a_zeta", "b_alpha")
        assert names == sorted(names)  # tools/list: in name order
        async with connect(served.url, "2026-07-28") as client:
            prompts = await client.list_prompts()
            assert [p.name for p in prompts.prompts] == ["a/greet", "b/greet"]
            assert (prompts.ttl_ms, prompts.cache_scope) == (20000, "public")  # the smallest
            resources = await client.list_resources()
            assert (resources.ttl_ms, resources.cache_scope) == (30000, "public")
            templates = await client.list_resource_templates()
            assert (templates.ttl_ms, templates.cache_scope) == (45000, "private")
            tools = await client.list_tools()  # the smallest ttl, the narrowest scope
            assert (tools.ttl_ms, tools.cache_scope) == (40000, "private")
            again = await client.list_tools()
            assert [t.name for t in again.tools] == [t.name for t in tools.tools]
        # b in the handshake era: no hint from it, so the merged prompts are immediately stale
        await reload(served, {"a": a, "b": {**b, "protocol": "legacy"}})
        with anyio.fail_after(30):
            while True:
                async with connect(served.url, "2026-07-28") as client:
                    prompts = await client.list_prompts()
                    listing = await client.list_tools()
                    after = [t.name for t in listing.tools]
                if len(prompts.prompts) == 2 and prompts.ttl_ms == 0 and listing.ttl_ms == 0:
                    break
                await anyio.sleep(0.1)
        assert prompts.cache_scope == listing.cache_scope == "private"
        assert after == names  # the same order after a reload


async def _post(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                headers: dict[str, str]) -> httpx.Response:
    return await http.post(url, json=body, headers={
        "Accept": "application/json, text/event-stream", **headers})


async def _session(http: httpx.AsyncClient, url: str, version: str) -> dict[str, str]:
    init = await _post(http, url, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}, {})
    headers = {"mcp-session-id": init.headers["mcp-session-id"],
               "mcp-protocol-version": version}
    await _post(http, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    return headers


def _events(text: str) -> list[dict[str, str]]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if block.strip():
            fields = [line.split(":", 1) for line in block.split("\n") if ":" in line]
            events.append({name: value.removeprefix(" ") for name, value in fields})
    return events


async def test_sse_streams_open_with_a_priming_event(tmp_path: Path) -> None:
    async with serving(tmp_path, {"fixture": fixture_server()}) as served, httpx.AsyncClient(
        headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ) as http:
        await listed(served, "test_tool_with_logging")
        url = served.url
        headers = await _session(http, url, "2025-11-25")
        listing = await _post(http, url, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                              headers)  # the first listing: the SDK's route, an SSE stream
        events = _events(listing.text)
        assert events[0]["data"] == "" and events[0]["id"], events[0]
        assert events[0]["retry"] == "1000", events[0]
        assert json.loads(events[-1]["data"])["id"] == 1 and events[-1]["id"], events[-1]
        await _post(http, url, {"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel",
                                "params": {"level": "debug"}}, headers)
        handled = served.fast_path.handled
        logged = await _post(http, url, {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                         "params": {"name": "test_tool_with_logging",
                                                    "arguments": {}}}, headers)
        assert served.fast_path.handled == handled + 1  # the fast route's own stream
        events = _events(logged.text)
        assert events[0] == {"id": events[0]["id"], "data": "", "retry": "1000"}, events
        assert len(events) > 2 and json.loads(events[-1]["data"])["id"] == 3, events
        old = await _session(http, url, "2025-03-26")  # before SEP-1699: no priming event
        listing = await _post(http, url, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                              old)
        assert all(event.get("data") for event in _events(listing.text)), listing.text
