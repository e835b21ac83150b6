"""`forward_headers` through a real daemon app: an HTTP upstream (a stateless `mcp` SDK server
under uvicorn whose tool answers with the headers it was sent) receives the named headers of
each `/v1` request, per request (two tenants, one after the other and at once), and neither
the headers it was not given nor the daemon's own Authorization."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp.server import Server

from sidecar import Location
from sidecar.serve.app import build_app
from tests.live_server import live_server

pytestmark = pytest.mark.anyio
TOKEN = "f" * 64


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def echo_app() -> Any:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="seen",
                                                       input_schema={"type": "object"})])

    async def call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        headers = ctx.request.headers
        seen = {name: headers.get(name) for name in ("x-tenant", "x-other", "authorization")}
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(seen))])

    server = Server("echo", on_list_tools=list_tools, on_call_tool=call)
    return server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True,
                                      json_response=True)


async def test_named_headers_of_each_request_reach_the_upstream(tmp_path: Path) -> None:
    async with live_server(echo_app()) as upstream:
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        (manifests / "echo.json").write_text(json.dumps({"mcpServers": {"echo": {
            "url": f"http://127.0.0.1:{upstream}/mcp", "forward_headers": ["X-Tenant"],
            "timeouts": {"startup": 10}}}}))
        async with Location.open(tmp_path, state_dir=tmp_path / "state",
                                 manifests=[manifests]) as location:
            async with live_server(build_app(location, token=TOKEN)) as port, \
                    httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30,
                                      headers={"authorization": f"Bearer {TOKEN}"}) as client:

                async def seen(call_id: str, **given: str) -> dict[str, Any]:
                    headers = {k.replace("_", "-"): v for k, v in given.items()}
                    snap = await client.post("/v1/snapshots", json={"session_id": call_id})
                    assert snap.status_code == 201, snap.text
                    response = await client.post(
                        f"/v1/snapshots/{snap.json()['id']}/calls", headers=headers, json={
                            "name": "echo_seen", "input": {}, "context": {
                                "session_id": call_id, "agent": "a", "message_id": "m",
                                "call_id": call_id}})
                    outcome = response.json()
                    assert outcome["status"] == "completed", outcome
                    answer: dict[str, Any] = json.loads(outcome["content"][0]["text"])
                    return answer

                assert await seen("c-1", x_tenant="acme", x_other="no") == {
                    "x-tenant": "acme", "x-other": None, "authorization": None}
                assert (await seen("c-2", x_tenant="globex"))["x-tenant"] == "globex"
                assert (await seen("c-3"))["x-tenant"] is None

                answers: dict[str, str] = {}

                async def tenant(name: str) -> None:
                    answers[name] = (await seen(f"at-once-{name}", x_tenant=name))["x-tenant"]

                async with anyio.create_task_group() as tg:
                    for name in ("acme", "globex", "initech"):
                        tg.start_soon(tenant, name)
                assert answers == {"acme": "acme", "globex": "globex", "initech": "initech"}


def test_forward_headers_refuse_the_daemons_credentials() -> None:
    from bridges.manifest.loading import ServerConfig
    with pytest.raises(ValueError, match="may not name Authorization"):
        ServerConfig(url="http://127.0.0.1:1/mcp", forward_headers=["Authorization"])
    with pytest.raises(ValueError, match="HTTP servers"):
        ServerConfig(command="true", forward_headers=["X-Tenant"])


async def test_through_mcp_each_request_forwards_its_own_headers(tmp_path: Path) -> None:
    from tests.serve.mcp_facade.conftest import serving
    from tests.serve.mcp_facade.test_http_fastpath import messages, raw_session

    async with live_server(echo_app()) as upstream, serving(tmp_path, {"echo": {
            "url": f"http://127.0.0.1:{upstream}/mcp", "forward_headers": ["X-Tenant"],
            "timeouts": {"startup": 10}}}) as served, raw_session(served) as raw:
        await raw.post(raw.request("tools/list"))
        for tenant in ("acme", "globex", "acme"):  # the SDK's way first, then the fast path
            answer = await raw.post(raw.request("tools/call", {
                "name": "echo_seen", "arguments": {}}), **{"x-tenant": tenant})
            result = messages(answer)[-1]["result"]
            assert json.loads(result["content"][0]["text"])["x-tenant"] == tenant, result
