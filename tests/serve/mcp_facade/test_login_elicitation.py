"""A call to a tool of a server that waits for an OAuth login, through the MCP facade with the `mcp`
Python client, against the real OAuth-protected server (tests/bridges/oauth_server.py): a client
with URL-mode elicitation is asked to open the authorization URL, a "browser" follows it, the
login completes in the daemon and the same call runs; a client without elicitation gets the
plain `needs_auth` error and no login is started. Over /mcp (both eras) and `sidecar stdio`."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from bridges.manifest.loading import ServerConfig
from bridges.mcp.oauth.login import login
from sidecar.backends.local.grants import FileGrantStore
from tests.bridges.helpers import eventually
from tests.bridges.oauth_server import OAuthServer
from tests.daemons import stop_daemon
from tests.live_server import live_server
from tests.serve.mcp_facade.conftest import Served, serving
from tests.serve.mcp_facade.test_http import connect

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]
ERAS = ["legacy", "2026-07-28"]


async def follow(url: str) -> None:
    """What the user's browser does: open the URL; the server redirects to the callback."""
    async with httpx.AsyncClient(follow_redirects=True, timeout=10) as browser:
        assert (await browser.get(url)).status_code == 200


class Browser:
    """A client's elicitation handler for URL mode: each URL it is asked to open is kept in
    `asked` and followed (`follow`), and the request accepted."""

    def __init__(self) -> None:
        self.asked: list[types.ElicitRequestURLParams] = []

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> Any:
        assert isinstance(params, types.ElicitRequestURLParams), params
        self.asked.append(params)
        await follow(params.url)
        return types.ElicitResult(action="accept")


@asynccontextmanager
async def waiting_for_login(tmp_path: Path) -> AsyncIterator[tuple[Served, OAuthServer]]:
    """A daemon whose `cloud` server was authorized once (its tools are registered), then had
    every token revoked: it is in `needs_auth`."""
    protected = OAuthServer()
    async with live_server(protected) as port:
        protected.base = f"http://127.0.0.1:{port}"
        url = f"{protected.base}/mcp"
        store = FileGrantStore(tmp_path / "state")
        assert (await login("cloud", ServerConfig(url=url, auth="oauth"), store,
                            show=follow)).ok
        servers = {"cloud": {"url": url, "auth": "oauth", "timeouts": {"startup": 10}}}
        async with serving(tmp_path, servers) as served:
            location = served.location
            assert location.server_health()["cloud"].state == "ready"
            protected.access.clear()  # the server revokes every access token
            protected.refresh.clear()  # and the refresh tokens
            async with connect(served.url, "legacy") as plain:
                await plain.list_tools()
                refused = await plain.call_tool("cloud_whoami", {})
            assert refused.is_error and "sidecar auth login cloud" in _text(refused)
            await eventually(lambda: location.server_health()["cloud"].state == "needs_auth",
                             what="needs_auth")
            yield served, protected


def _text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_with_url_elicitation_is_asked_to_log_in(
    tmp_path: Path, mode: str
) -> None:
    open_in_browser = Browser()
    asked = open_in_browser.asked

    async with waiting_for_login(tmp_path) as (served, protected), connect(
        served.url, mode, elicitation_callback=open_in_browser
    ) as client:
        await client.list_tools()
        result = await client.call_tool("cloud_whoami", {})
        assert not result.is_error, _text(result)
        assert _text(result) == "authorized"
        assert len(asked) == 1
        assert asked[0].url.startswith(f"{protected.base}/authorize?")
        assert "'cloud'" in asked[0].message and "cloud_whoami" in asked[0].message
        assert served.location.server_health()["cloud"].state == "ready"
        pool = served.location.upstreams
        attempt = pool.logins.get("cloud")  # type: ignore[union-attr]
        assert attempt is not None and attempt.state == "authorized"
        # Logged in: the next call is not asked anything.
        again = await client.call_tool("cloud_whoami", {})
        assert _text(again) == "authorized" and len(asked) == 1


async def test_with_a_public_url_the_browser_comes_back_to_the_daemons_callback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`SIDECAR_PUBLIC_URL` (a gateway in front): the URL the client is asked to open redirects
    to `/v1/auth/cloud/callback` under the public URL, not a loopback; the test plays the
    gateway, forwarding the redirect to the daemon with the public Host."""
    monkeypatch.setenv("SIDECAR_PUBLIC_URL", "https://gateway.test")
    asked: list[str] = []
    served_at: list[str] = []

    async def open_through_the_gateway(ctx: Any, params: types.ElicitRequestParams) -> Any:
        assert isinstance(params, types.ElicitRequestURLParams), params
        asked.append(params.url)
        async with httpx.AsyncClient(timeout=10) as browser:
            back = httpx.URL((await browser.get(params.url)).headers["location"])
            assert (back.host, back.path) == ("gateway.test", "/v1/auth/cloud/callback")
            daemon = httpx.URL(served_at[0])
            landed = await browser.get(back.copy_with(scheme="http", host=daemon.host,
                                                      port=daemon.port),
                                       headers={"host": "gateway.test"})
        assert landed.headers["sidecar-login"] == "authorized", landed.text
        return types.ElicitResult(action="accept")

    async with waiting_for_login(tmp_path) as (served, _), connect(
        served.url, "legacy", elicitation_callback=open_through_the_gateway
    ) as client:
        served_at.append(served.url)
        await client.list_tools()
        result = await client.call_tool("cloud_whoami", {})
        assert not result.is_error and _text(result) == "authorized", _text(result)
        assert len(asked) == 1


async def test_a_declined_login_gives_the_plain_error(tmp_path: Path) -> None:
    async def decline(ctx: Any, params: types.ElicitRequestParams) -> Any:
        return types.ElicitResult(action="decline")

    async with waiting_for_login(tmp_path) as (served, _), connect(
        served.url, "legacy", elicitation_callback=decline
    ) as client:
        await client.list_tools()
        result = await client.call_tool("cloud_whoami", {})
        assert result.is_error and "run `sidecar auth login cloud`" in _text(result)


@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_without_url_elicitation_gets_the_plain_error(
    tmp_path: Path, mode: str
) -> None:
    async with waiting_for_login(tmp_path) as (served, _), connect(served.url, mode) as client:
        await client.list_tools()
        result = await client.call_tool("cloud_whoami", {})
        assert result.is_error
        assert "run `sidecar auth login cloud`" in _text(result), _text(result)
        pool = served.location.upstreams
        assert pool.logins.get("cloud") is None  # type: ignore[union-attr]
        assert served.location.server_health()["cloud"].state == "needs_auth"
        health = json.dumps(served.location.server_health()["cloud"].to_json())
        assert "sidecar auth login cloud" in health


async def test_sidecar_stdio_asks_its_client_to_log_in(tmp_path: Path) -> None:
    """The same through `sidecar stdio` as an agent launches it (the daemon it starts runs
    the login and its loopback callback)."""
    protected = OAuthServer()
    asked: list[str] = []

    async def open_in_browser(ctx: Any, params: types.ElicitRequestParams) -> Any:
        assert isinstance(params, types.ElicitRequestURLParams), params
        asked.append(params.url)
        await follow(params.url)
        return types.ElicitResult(action="accept")

    async with live_server(protected) as port:
        protected.base = f"http://127.0.0.1:{port}"
        url = f"{protected.base}/mcp"
        state = tmp_path / "state"
        assert (await login("cloud", ServerConfig(url=url, auth="oauth"), FileGrantStore(state),
                            show=follow)).ok
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        (manifests / "cloud.json").write_text(json.dumps({"mcpServers": {"cloud": {
            "url": url, "auth": "oauth", "timeouts": {"startup": 10}}}}))
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "sidecar.cli", "stdio"], cwd=str(ROOT),
            env={"SIDECAR_STATE_DIR": str(state), "SIDECAR_MANIFESTS": str(manifests)},
        )
        try:
            async with Client(params, mode="legacy", cache=None, read_timeout_seconds=60,
                              elicitation_callback=open_in_browser) as client:
                await eventually_listed(client, "cloud_whoami")
                protected.access.clear()  # the server revokes every access token
                protected.refresh.clear()  # and the refresh tokens
                result = await client.call_tool("cloud_whoami", {})
                assert result.is_error and "sidecar auth login cloud" in _text(result)
                for _ in range(100):  # until the daemon has put the server in needs_auth
                    result = await client.call_tool("cloud_whoami", {})
                    if asked:
                        break
                    await anyio.sleep(0.1)
                assert len(asked) == 1
                assert asked[0].startswith(f"{protected.base}/authorize?")
                assert not result.is_error and _text(result) == "authorized", _text(result)
        finally:
            stop_daemon(state)


async def eventually_listed(client: Client, name: str) -> None:
    for _ in range(100):
        if name in [t.name for t in (await client.list_tools()).tools]:
            return
        await anyio.sleep(0.1)
    raise AssertionError(f"{name} was never listed")
