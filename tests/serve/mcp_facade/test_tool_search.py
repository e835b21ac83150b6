"""Tool search (`expose = "search"`) through real clients: the Python `mcp` client against a real
`sidecar serve` (/mcp and /mcp/{profile}) and a real `sidecar stdio --standalone`, a
pydantic-ai agent over /mcp, and the native API's snapshots. Upstreams: the published
`mcp-server-time` (scripts/bootstrap-servers) and the SDK test server (namespace `t`); for the
login asked before a `call_tool`, the OAuth-protected test server (tests/bridges)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.hardening.daemon_process import Daemon, run_cli, serving, sidecar_env
from tests.serve.mcp_facade.test_http import connect
from tests.serve.mcp_facade.test_login_elicitation import Browser, waiting_for_login

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[3]
TESTSERVER = REPO / "tests/bridges/servers/testserver.py"
TIME_PYTHON = REPO / ".deps/venv-time/bin/python"
TRIO = {"search_tools", "call_tool", "managed_read"}
CALL_ID = "io.mcp-sidecar/call_id"

MANIFEST = f"""
expose = "search"

[mcpServers.time]
command = {json.dumps(str(TIME_PYTHON))}
args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]
namespace = "time"

[mcpServers.t]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TESTSERVER))}]
namespace = "t"
protocol = "legacy"

[profiles.ops]
servers = ["time", "t"]
always = ["time_get_current_time"]
tool_rate_limits = {{ "t_echo" = {{ calls_per_minute = 1 }} }}

[[profiles.ops.permissions.rules]]
action = "t_crash"
decision = "deny"
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the daemon under test is its own process with its own loop


def manifests(directory: Path) -> Path:
    assert TIME_PYTHON.exists(), "run scripts/bootstrap-servers first (mcp-server-time)"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "search.toml").write_text(MANIFEST)
    return directory


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("tool-search")
    with serving(base / "state", manifests=manifests(base / "manifests")) as running:
        yield running


@asynccontextmanager
async def over_http(daemon: Daemon, path: str = "/mcp", mode: str = "legacy",
                    ) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {daemon.token}"},
                                  timeout=httpx2.Timeout(60)) as http, \
            Client(streamable_http_client(f"{daemon.url}{path}", http_client=http), mode=mode,
                   cache=None) as client:
        yield client


def hits(result: types.CallToolResult) -> list[str]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return [tool["name"] for tool in result.structured_content["tools"]]


def text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def found(client: Client, query: str, wanted: str) -> types.CallToolResult:
    """`search_tools(query)` once `wanted` is among its hits (upstreams start in the
    background; a listing after `list_changed` takes a new snapshot)."""
    with anyio.fail_after(60):
        while True:
            await client.list_tools()
            result = await client.call_tool("search_tools", {"query": query})
            if wanted in hits(result):
                return result
            await anyio.sleep(0.1)


def history(daemon: Daemon, **query: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{daemon.url}/v1/calls", params=query, timeout=30,
                         headers={"Authorization": f"Bearer {daemon.token}"})
    response.raise_for_status()
    calls: list[dict[str, Any]] = response.json()["calls"]
    return calls


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_mcp_client_lists_the_search_tools_finds_and_calls_the_real_tool(
    daemon: Daemon, mode: str,
) -> None:
    async with over_http(daemon, mode=mode) as client:
        listed = await client.list_tools()
        assert {t.name for t in listed.tools} == TRIO
        result = await found(client, "current time in Tokyo", "time_get_current_time")
        assert hits(result)[0] == "time_get_current_time"
        first = result.structured_content["tools"][0]  # type: ignore[index]
        assert set(first) == {"name", "description", "input_schema"}
        assert "timezone" in first["input_schema"]["properties"]
        assert "time_get_current_time" in text(result) and '"timezone"' in text(result)

        call_id = f"search-{mode}"
        ran = await client.call_tool("call_tool", {
            "name": "time_get_current_time", "arguments": {"timezone": "Asia/Tokyo"}},
            meta={CALL_ID: call_id})
        assert not ran.is_error and "Asia/Tokyo" in text(ran)
    [row] = [c for c in history(daemon, tool="time_get_current_time") if c["call_id"] == call_id]
    assert row["status"] == "completed" and row["input"] == {"timezone": "Asia/Tokyo"}
    assert not [c for c in history(daemon, tool="call_tool") if c["call_id"] == call_id]


async def test_call_tool_errors_name_the_tool_and_suggest_search_tools(daemon: Daemon) -> None:
    async with over_http(daemon) as client:
        await found(client, "convert a time between timezones", "time_convert_time")
        unknown = await client.call_tool("call_tool", {"name": "time_get_curent_time"})
        assert unknown.is_error
        assert "'time_get_curent_time'" in text(unknown) and "search_tools" in text(unknown)
        assert "Did you mean: time_get_current_time" in text(unknown)
        invalid = await client.call_tool("call_tool", {"name": "time_get_current_time",
                                                      "arguments": {}})
        assert invalid.is_error
        assert "time_get_current_time" in text(invalid) and "'timezone'" in text(invalid)
        malformed = await client.call_tool("call_tool", {"tool": "time_get_current_time"})
        assert malformed.is_error and "call_tool" in text(malformed)
        itself = await client.call_tool("call_tool", {"name": "search_tools",
                                                     "arguments": {"query": "x"}})
        assert itself.is_error and "call search_tools directly" in text(itself)


async def test_a_profile_lists_its_always_tools_and_call_tool_keeps_its_rules(
    daemon: Daemon,
) -> None:
    async with over_http(daemon, "/mcp/ops") as client:
        listed = await client.list_tools()
        assert {t.name for t in listed.tools} == {*TRIO, "time_get_current_time"}
        await found(client, "echo some text back", "t_echo")
        crash = await client.call_tool("search_tools", {"query": "exit the process mid-call"})
        assert "t_crash" not in hits(crash)  # denied outright: not served, not found
        denied = await client.call_tool("call_tool", {"name": "t_crash", "arguments": {}})
        assert denied.is_error and "t_crash" in text(denied)

        first = await client.call_tool("call_tool", {"name": "t_echo",
                                                    "arguments": {"text": "hi"}},
                                       meta={CALL_ID: "ops-echo-1"})
        assert not first.is_error and text(first) == "hi", text(first)
        second = await client.call_tool("call_tool", {"name": "t_echo",
                                                     "arguments": {"text": "again"}},
                                        meta={CALL_ID: "ops-echo-2"})
        assert second.is_error and "rate" in text(second).lower()
    rows = {c["call_id"]: c for c in history(daemon, tool="t_echo", profile="ops")}
    assert rows["ops-echo-1"]["status"] == "completed"
    assert rows["ops-echo-2"]["status"] == "error"


async def test_search_follows_list_changed(daemon: Daemon) -> None:
    async with over_http(daemon) as client:
        await found(client, "add and remove tools", "t_mutate")
        added = await client.call_tool("call_tool", {
            "name": "t_mutate", "arguments": {"add": ["weather_forecast_lookup"]}})
        assert not added.is_error
        try:
            await found(client, "weather forecast lookup", "t_weather_forecast_lookup")
            ran = await client.call_tool("call_tool", {"name": "t_weather_forecast_lookup"})
            assert text(ran) == "weather_forecast_lookup ran"
        finally:
            await client.call_tool("call_tool", {
                "name": "t_mutate", "arguments": {"remove": ["weather_forecast_lookup"]}})
        with anyio.fail_after(60):  # removed: no longer found
            while True:
                await client.list_tools()
                gone = await client.call_tool("search_tools", {"query": "weather forecast"})
                if "t_weather_forecast_lookup" not in hits(gone):
                    break
                await anyio.sleep(0.1)


async def test_sidecar_stdio_serves_the_search_tools(tmp_path: Path) -> None:
    env = sidecar_env(tmp_path / "state", manifests(tmp_path / "manifests"))
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "sidecar.cli", "stdio", "--standalone"],
                                   env=env, cwd=str(REPO))
    async with Client(params, mode="legacy", cache=None, read_timeout_seconds=60) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TRIO
        await found(client, "current time in a timezone", "time_get_current_time")
        ran = await client.call_tool("call_tool", {
            "name": "time_get_current_time", "arguments": {"timezone": "Europe/Paris"}})
        assert not ran.is_error and "Europe/Paris" in text(ran)


async def test_pydantic_ai_agent_searches_then_calls(daemon: Daemon) -> None:
    seen: list[set[str]] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append({t.name for t in info.function_tools})
        returns = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts
                   if isinstance(p, ToolReturnPart)]
        if not returns:
            return ModelResponse(parts=[ToolCallPart(
                "search_tools", {"query": "current time in Paris"})])
        if len(returns) == 1:
            best = returns[0].content["tools"][0]["name"]  # the structured result
            return ModelResponse(parts=[ToolCallPart("call_tool", {
                "name": best, "arguments": {"timezone": "Europe/Paris"}})])
        return ModelResponse(parts=[TextPart(str(returns[-1].content))])

    toolset: MCPToolset[None] = MCPToolset(
        f"{daemon.url}/mcp", headers={"Authorization": f"Bearer {daemon.token}"},
        read_timeout=60, cache_tools=False)
    async with toolset:
        async with over_http(daemon) as client:  # the upstream is listed
            await found(client, "current time", "time_get_current_time")
        result = await Agent(FunctionModel(respond), toolsets=[toolset]).run("time in Paris?")
    assert seen and all(names == TRIO for names in seen)
    assert "Europe/Paris" in result.output


async def test_native_api_snapshots_with_expose_search(daemon: Daemon) -> None:
    headers = {"Authorization": f"Bearer {daemon.token}"}
    async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=30) as http:
        async with over_http(daemon) as client:
            await found(client, "current time", "time_get_current_time")
        made = await http.post("/v1/snapshots", json={
            "session_id": "api", "expose": "search", "format": "openai"})
        assert made.status_code == 201, made.text
        assert {d["function"]["name"] for d in made.json()["definitions"]} == TRIO
        snapshot = made.json()["id"]

        anthropic = (await http.post("/v1/snapshots", json={
            "session_id": "api", "expose": "search", "format": "anthropic"})).json()
        tools = anthropic["definitions"]
        assert tools[-1] == {"type": "tool_search_tool_bm25_20251119",
                             "name": "tool_search_tool_bm25"}
        loaded = {t["name"] for t in tools[:-1] if not t.get("defer_loading")}
        deferred = {t["name"] for t in tools[:-1] if t.get("defer_loading") is True}
        assert loaded == {"managed_read"}
        assert {"time_get_current_time", "t_echo"} <= deferred

        every = (await http.post("/v1/snapshots", json={
            "session_id": "api", "expose": "all", "format": "openai"})).json()
        assert len(every["definitions"]) > len(TRIO) + 10

        def call(name: str, payload: dict[str, Any], call_id: str) -> dict[str, Any]:
            return {"name": name, "input": payload, "context": {
                "session_id": "api", "agent": "test", "message_id": call_id,
                "call_id": call_id}}

        via = await http.post(f"/v1/snapshots/{snapshot}/calls", json=call(
            "call_tool", {"name": "time_get_current_time",
                          "arguments": {"timezone": "America/Lima"}}, "api-1"))
        assert via.json()["status"] == "completed" and via.json()["tool"] == (
            "time_get_current_time")
        direct = await http.post(f"/v1/snapshots/{snapshot}/calls", json=call(
            "t_echo", {"text": "unlisted but captured"}, "api-2"))
        assert direct.json()["status"] == "completed"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_call_tool_of_a_server_waiting_for_login_asks_for_the_login_first(
    tmp_path: Path, mode: str
) -> None:
    """In search mode the client calls `call_tool`: the login is judged by the tool its
    arguments name (tests/bridges/oauth_server.py, as in test_login_elicitation.py)."""
    open_in_browser = Browser()
    asked = open_in_browser.asked

    async with waiting_for_login(tmp_path) as (served, protected):
        served.location.expose = "search"
        async with connect(served.url, mode, elicitation_callback=open_in_browser) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TRIO
            result = await client.call_tool("call_tool", {"name": "cloud_whoami",
                                                          "arguments": {}})
            text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
            assert not result.is_error and text == "authorized", text
            assert len(asked) == 1 and asked[0].url.startswith(f"{protected.base}/authorize?")
            assert "cloud_whoami" in asked[0].message
            assert served.location.server_health()["cloud"].state == "ready"


def test_tool_listings_of_a_search_profile_defer_the_unlisted_tools_for_anthropic(
    daemon: Daemon, tmp_path: Path,
) -> None:
    """`GET /v1/tools?profile=P&format=anthropic` and `sidecar tools --format anthropic` (through
    the daemon and `--embedded`) answer as `POST /v1/snapshots` does: the listed tools, every
    other one with `defer_loading: true`, then Anthropic's tool search tool; other formats list
    what `tools/list` serves."""
    def check_anthropic(tools: list[dict[str, Any]]) -> None:
        assert tools[-1]["name"] == "tool_search_tool_bm25"
        loaded = {t["name"] for t in tools[:-1] if not t.get("defer_loading")}
        deferred = {t["name"] for t in tools[:-1] if t.get("defer_loading") is True}
        assert loaded == {"managed_read", "time_get_current_time"}
        assert "t_echo" in deferred and not deferred & TRIO

    headers = {"Authorization": f"Bearer {daemon.token}"}
    with anyio.from_thread.start_blocking_portal() as portal, httpx.Client(
        base_url=daemon.url, headers=headers, timeout=30
    ) as http:
        async def echo_found() -> None:
            async with over_http(daemon, "/mcp/ops") as client:
                await found(client, "echo some text back", "t_echo")

        portal.call(echo_found)  # the upstreams have started
        check_anthropic(http.get("/v1/tools", params={"profile": "ops",
                                                      "format": "anthropic"}).json()["tools"])
        openai = http.get("/v1/tools", params={"profile": "ops", "format": "openai"}).json()
        assert {t["function"]["name"] for t in openai["tools"]} == {*TRIO,
                                                                    "time_get_current_time"}
    manifest_dir = daemon.state.parent / "manifests"
    shown = run_cli("tools", "--format", "anthropic", "--profile", "ops",
                    env=sidecar_env(daemon.state, manifest_dir), timeout=120)
    assert shown.returncode == 0, shown.stderr
    check_anthropic(json.loads(shown.stdout))
    embedded = run_cli("tools", "--format", "anthropic", "--profile", "ops", "--embedded",
                       env=sidecar_env(tmp_path / "state", manifest_dir), timeout=120)
    assert embedded.returncode == 0, embedded.stderr
    check_anthropic(json.loads(embedded.stdout))
