"""Profiles on a real daemon: two MCP test servers, `/mcp/NAME`, `/v1`, Code Mode, reload."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from sidecar import Location, ToolContext
from sidecar.registry.profiles import UnknownProfile
from sidecar.serve.app import build_app
from sidecar.serve.mcp_facade import mcp_http
from tests.bridges.helpers import TESTSERVER
from tests.live_server import live_server

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "profiles-token"

PROFILES = """
[profiles.coding]
description = "a coding agent"
servers = ["alpha"]
exclude = ["alpha_crash", "alpha_mutate"]

[profiles.research]
servers = ["beta"]
include = ["alpha_echo"]
read_only = true
codemode = "codemode"
"""


def write_manifests(directory: Path, profiles: str = PROFILES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    servers = {
        key: {"command": sys.executable, "args": [str(TESTSERVER)]} for key in ("alpha", "beta")
    }
    (directory / "servers.json").write_text(json.dumps({"mcpServers": servers}))
    (directory / "profiles.toml").write_text(profiles)
    return directory


@dataclass
class Daemon:
    url: str
    location: Location
    http: httpx.AsyncClient


@asynccontextmanager
async def daemon(tmp_path: Path, *, watch: bool = False) -> AsyncIterator[Daemon]:
    manifests = write_manifests(tmp_path / "manifests")
    async with Location.open(tmp_path, state_dir=tmp_path / "state", manifests=[manifests],
                             watch=watch) as location:
        with anyio.fail_after(30):
            while not all(h.state == "ready" for h in location.server_health().values()):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        routes, lifespan = mcp_http(location)
        app = build_app(location, token=TOKEN, extra_routes=routes, extra_lifespan=lifespan)
        async with live_server(app) as port:
            url = f"http://127.0.0.1:{port}"
            headers = {"authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
                yield Daemon(url, location, http)


@asynccontextmanager
async def connect(url: str, token: str = TOKEN, **kwargs: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy",
                          cache=None, **kwargs) as client:
            yield client


async def names_of(client: Client) -> set[str]:
    return {t.name for t in (await client.list_tools()).tools}


async def call(client: Client, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    params = types.CallToolRequestParams(name=name, arguments=arguments)
    return await client.session.send_request(types.CallToolRequest(params=params),
                                             types.CallToolResult)


def ctx(call_id: str) -> ToolContext:
    return ToolContext("s", "a", "m", call_id)


async def test_two_profiles_served_at_once_with_different_tool_lists(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d, connect(f"{d.url}/mcp/coding") as coding, \
            connect(f"{d.url}/mcp/research") as research, connect(f"{d.url}/mcp") as everything:
        coding_names = await names_of(coding)
        research_names = await names_of(research)
        all_names = await names_of(everything)
        assert "alpha_echo" in coding_names and "alpha_add" in coding_names
        assert "managed_read" in coding_names  # built-ins stay: previews point to it
        assert not any(n.startswith("beta_") for n in coding_names)
        assert {"alpha_crash", "alpha_mutate"}.isdisjoint(coding_names)
        # research: Code Mode, so its tools sit behind execute/search_tools/describe_tools
        assert {"execute", "search_tools", "describe_tools"} <= research_names
        assert not any(n.startswith("alpha_") for n in research_names)
        assert {"alpha_echo", "beta_echo", "beta_crash", "beta_add"} <= all_names
        # the same tool, called through each endpoint that serves it
        result = await call(coding, "alpha_echo", {"text": "from coding"})
        assert not result.is_error and result.content[0].text == "from coding"
        snap = d.location.snapshot(profile="research", codemode="direct", keep=False)
        # read_only = true keeps only read-only tools (echo, progress) of beta, and the
        # included alpha_echo
        assert set(snap.names) == {"alpha_echo", "beta_echo", "beta_progress", "managed_read"}


async def test_unknown_profile_is_404_and_an_error_in_python(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d:
        res = await d.http.post("/mcp/nope", json={})
        assert res.status_code == 404
        assert res.json()["error"]["code"] == "unknown_profile"
        assert "coding" in res.json()["error"]["message"]
        snap = await d.http.post("/v1/snapshots", json={"session_id": "s", "profile": "nope"})
        assert snap.status_code == 404 and snap.json()["error"]["field"] == "profile"
        with pytest.raises(UnknownProfile, match="research"):
            d.location.snapshot(profile="nope")


async def test_a_call_outside_the_profile_fails_even_when_the_name_is_guessed(
    tmp_path: Path,
) -> None:
    async with daemon(tmp_path) as d, connect(f"{d.url}/mcp/coding") as coding:
        await names_of(coding)
        guessed = await call(coding, "beta_echo", {"text": "sneaky"})
        assert guessed.is_error
        text = guessed.content[0].text
        assert "Unknown tool: beta_echo" in text
        assert "beta_" not in text.removeprefix("Unknown tool: beta_echo")  # nothing leaks
        excluded = await call(coding, "alpha_crash", {})
        assert excluded.is_error and "Unknown tool: alpha_crash" in excluded.content[0].text
        # the native API, through a profile
        res = await d.http.post("/v1/snapshots", json={"session_id": "s", "profile": "coding"})
        assert res.status_code == 201 and res.json()["profile"] == "coding"
        out = await d.http.post(f"/v1/snapshots/{res.json()['id']}/calls", json={
            "name": "beta_echo", "input": {"text": "x"},
            "context": {"session_id": "s", "agent": "a", "message_id": "m", "call_id": "g1"}})
        assert out.json()["status"] == "error"
        assert out.json()["error"]["kind"] == "unknown_tool"
        # the Python API
        outcome = await d.location.snapshot(profile="coding").execute(
            "beta_echo", {"text": "x"}, ctx("g2"))
        assert outcome.error is not None and outcome.error.kind == "unknown_tool"


async def test_code_mode_nested_calls_reach_only_the_profile(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d:
        snap = d.location.snapshot(profile="research")
        inside = 'r = await call_tool("beta_echo", {"text": "in"})\nprint(r)'
        done = await snap.execute("execute", {"code": inside}, ctx("cm1"))
        assert done.status == "completed", done
        assert "in" in done.content[0].text
        outside = 'r = await call_tool("alpha_add", {"a": 1, "b": 2})\nprint(r)'
        refused = await snap.execute("execute", {"code": outside}, ctx("cm2"))
        text = refused.error.message if refused.error is not None else refused.content[0].text
        assert "alpha_add" in text and "unknown_tool" in text
        nested = await d.location.outcome("cm2/1")
        assert nested is not None and nested.error is not None
        assert nested.error.kind == "unknown_tool"
        # a destructive tool of the profile's server is outside the profile (read_only)
        crash = 'await call_tool("beta_crash", {})'
        refused = await snap.execute("execute", {"code": crash}, ctx("cm3"))
        nested = await d.location.outcome("cm3/1")
        assert nested is not None and nested.error is not None
        assert nested.error.kind == "unknown_tool"
        assert refused.status == "error" or "unknown_tool" in refused.content[0].text
        assert d.location.server_health()["beta"].state == "ready"  # it never ran


async def test_reload_notifies_only_the_sessions_whose_profile_changed(tmp_path: Path) -> None:
    seen: dict[str, int] = {"coding": 0, "research": 0}

    def counter(name: str) -> Any:
        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                seen[name] += 1
        return on_message

    async with daemon(tmp_path, watch=True) as d, \
            connect(f"{d.url}/mcp/coding", message_handler=counter("coding")) as coding, \
            connect(f"{d.url}/mcp/research", message_handler=counter("research")) as research:
        await names_of(coding)
        await names_of(research)
        profiles = tmp_path / "manifests" / "profiles.toml"
        tmp = profiles.with_suffix(".tmp")
        first = PROFILES.replace('"alpha_mutate"]', '"alpha_mutate", "alpha_add"]')
        tmp.write_text(first)
        tmp.replace(profiles)
        with anyio.fail_after(20):
            while seen["coding"] == 0:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert "alpha_add" not in await names_of(coding)
        # a second change, to research only: research hears it; coding heard only the first
        tmp.write_text(first.replace('codemode = "codemode"', 'codemode = "direct"'))
        tmp.replace(profiles)
        with anyio.fail_after(20):
            while seen["research"] == 0:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert "beta_echo" in await names_of(research)
        assert seen == {"coding": 1, "research": 1}


async def test_sidecar_stdio_serves_the_named_profile(tmp_path: Path) -> None:
    manifests = write_manifests(tmp_path / "manifests")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "sidecar.cli", "stdio", "--profile", "coding", "--manifests",
              str(manifests), "--state-dir", str(tmp_path / "state")],
        cwd=str(ROOT),
    )
    async with Client(params, mode="legacy", cache=None, read_timeout_seconds=60) as client:
        with anyio.fail_after(60):  # the daemon starts its servers in the background
            for _ in range(100_000):
                names = await names_of(client)
                if "alpha_echo" in names:
                    break
                await anyio.sleep(0.1)
        assert "alpha_echo" in names and not any(n.startswith("beta_") for n in names)
        guessed = await call(client, "beta_echo", {"text": "x"})
        assert guessed.is_error and "Unknown tool: beta_echo" in guessed.content[0].text


def test_sidecar_stdio_refuses_an_unknown_profile(tmp_path: Path) -> None:
    manifests = write_manifests(tmp_path / "manifests")
    done = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "stdio", "--profile", "nope", "--manifests",
         str(manifests), "--state-dir", str(tmp_path / "state")],
        input="", capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert done.returncode == 2
    assert "no profile named 'nope'" in done.stderr and done.stdout == ""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


async def test_a_scoped_token_reaches_only_its_profiles(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d:
        state = str(tmp_path / "state")
        made = await anyio.to_thread.run_sync(
            lambda: cli("token", "create", "--profile", "coding", "--label", "ci",
                        "--state-dir", state))
        assert made.returncode == 0, made.stderr
        secret = made.stdout.strip()
        assert secret.startswith("sct_")
        listed = await anyio.to_thread.run_sync(
            lambda: cli("token", "list", "--json", "--state-dir", state))
        (record,) = json.loads(listed.stdout)
        assert record["profiles"] == ["coding"] and record["label"] == "ci"
        assert secret not in listed.stdout and secret not in (tmp_path / "state" /
                                                                "tokens.sqlite").read_text(
            errors="replace")
        async with connect(f"{d.url}/mcp/coding", token=secret) as coding:
            assert "alpha_echo" in await names_of(coding)
        scoped = {"authorization": f"Bearer {secret}"}
        for path in ("/mcp/research", "/mcp"):
            refused = await d.http.post(path, json={}, headers=scoped)
            assert refused.status_code == 403, path
            assert refused.json()["error"]["code"] == "forbidden_profile"
        v1 = await d.http.post("/v1/snapshots", headers=scoped,
                               json={"session_id": "s", "profile": "research"})
        assert v1.status_code == 403 and v1.json()["error"]["field"] == "profile"
        default = await d.http.post("/v1/snapshots", headers=scoped, json={"session_id": "s"})
        assert default.status_code == 403  # the default profile is not one of its profiles
        ok = await d.http.post("/v1/snapshots", headers=scoped,
                               json={"session_id": "s", "profile": "coding"})
        assert ok.status_code == 201
        # a snapshot of another profile, taken with the all-access token, stays out of reach
        other = await d.http.post("/v1/snapshots", json={"session_id": "s",
                                                         "profile": "research"})
        assert other.status_code == 201
        body = {"name": "beta_echo", "input": {"text": "x"},
                "context": {"session_id": "s", "agent": "a", "message_id": "m",
                            "call_id": "t1"}}
        call = await d.http.post(f"/v1/snapshots/{other.json()['id']}/calls", json=body,
                                 headers=scoped)
        assert call.status_code == 403
        assert await d.location.outcome("t1") is None  # nothing ran
        assert (await d.http.get("/v1/health", headers=scoped)).status_code == 403
        assert (await d.http.get("/v1/health")).status_code == 200  # all-access still works
        tools = await d.http.get("/v1/tools", params={"profile": "coding"}, headers=scoped)
        assert tools.status_code == 200
        # revoked: the next request is refused
        revoked = await anyio.to_thread.run_sync(
            lambda: cli("token", "revoke", record["id"], "--state-dir", state))
        assert revoked.returncode == 0, revoked.stderr
        gone = await d.http.post("/v1/snapshots", headers=scoped,
                                 json={"session_id": "s", "profile": "coding"})
        assert gone.status_code == 401
        again = await anyio.to_thread.run_sync(
            lambda: cli("token", "revoke", record["id"], "--state-dir", state))
        assert again.returncode == 1 and "no token" in again.stderr
