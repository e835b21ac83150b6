"""A user's own login asked of their MCP client (URL-mode elicitation) for a server with
credentials per user (`oauth.per_user`), through the facade with the `mcp` Python client and
the real OAuth test server: erin (a token made for her) calls a tool before she ever logged in,
is asked to open the authorization URL, a "browser" follows it, and the same call runs with
her own new access token; her next call asks nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bridges.manifest.loading import ServerConfig
from bridges.mcp.oauth.login import login
from sidecar.backends.local.grants import FileGrantStore
from sidecar.stores.tokens import create_token
from tests.bridges.oauth_server import OAuthServer
from tests.live_server import live_server
from tests.serve.mcp_facade.conftest import serving
from tests.serve.mcp_facade.test_login_elicitation import Browser, _text, follow

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def as_bearer(url: str, bearer: str, **kwargs: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"},
                                  timeout=httpx2.Timeout(30)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy",
                          cache=None, **kwargs) as client:
            yield client


async def test_a_user_is_asked_for_their_own_login(tmp_path: Path) -> None:
    protected = OAuthServer()
    open_in_browser = Browser()
    asked = open_in_browser.asked

    async with live_server(protected) as port:
        protected.base = f"http://127.0.0.1:{port}"
        url = f"{protected.base}/mcp"
        store = FileGrantStore(tmp_path / "state")
        config = ServerConfig(url=url, auth="oauth", oauth={"per_user": True})
        assert (await login("cloud", config, store, show=follow)).ok  # the tool list
        servers = {"cloud": {"url": url, "auth": "oauth", "oauth": {"per_user": True},
                             "timeouts": {"startup": 10}}}
        async with serving(tmp_path, servers) as served:
            location = served.location
            assert location.server_health()["cloud"].state == "ready"
            erin, _ = await create_token(location.stores.tokens,
                                         profiles=[location.profiles.default_name],
                                         user="erin")
            async with as_bearer(served.url, erin,
                                 elicitation_callback=open_in_browser) as client:
                await client.list_tools()
                result = await client.call_tool("cloud_whoami", {})
                assert not result.is_error, _text(result)
                assert len(asked) == 1 and asked[0].url.startswith(f"{protected.base}/authorize?")
                record = await store.get("cloud@user:erin")
                assert record is not None
                assert protected.called[-1] == ("whoami", record["tokens"]["access_token"])
                again = await client.call_tool("cloud_whoami", {})
                assert not again.is_error and len(asked) == 1
            fay, _ = await create_token(location.stores.tokens,
                                        profiles=[location.profiles.default_name], user="fay")
            async with as_bearer(served.url, fay) as plain:  # no elicitation: told the command
                await plain.list_tools()
                refused = await plain.call_tool("cloud_whoami", {})
                assert refused.is_error
                assert "sidecar auth login cloud --user fay" in _text(refused), _text(refused)
