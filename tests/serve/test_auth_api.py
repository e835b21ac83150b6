"""`/v1/auth/{server}`: a login started over the native API, against a real OAuth-protected
server (tests/bridges/oauth_server.py): the server waits in `needs_auth` (health names the
command), the login answers with the authorization URL, the redirect reaches the daemon's
loopback callback, and the server becomes ready."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from sidecar import Location
from sidecar.serve.app import build_app
from tests.bridges.helpers import eventually
from tests.bridges.oauth_server import OAuthServer
from tests.live_server import live_server

pytestmark = pytest.mark.anyio
TOKEN = "t" * 64


async def test_a_login_started_over_the_api(tmp_path: Path) -> None:
    protected = OAuthServer()
    async with live_server(protected) as upstream_port:
        protected.base = f"http://127.0.0.1:{upstream_port}"
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        (manifests / "cloud.json").write_text(json.dumps({"mcpServers": {"cloud": {
            "url": f"{protected.base}/mcp", "timeouts": {"startup": 10}}}}))
        async with Location.open(tmp_path, state_dir=tmp_path / "state",
                                 manifests=[manifests]) as location:
            app = build_app(location, token=TOKEN)
            async with live_server(app) as port, httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=30,
                headers={"authorization": f"Bearer {TOKEN}"},
            ) as client:
                health = (await client.get("/v1/health")).json()["servers"]["cloud"]
                assert health["state"] == "needs_auth"
                assert "run `sidecar auth login cloud`" in health["last_error"]
                before = (await client.get("/v1/auth/cloud")).json()
                assert before["needs_login"] and before["command"] == "sidecar auth login cloud"
                assert (await client.get("/v1/auth/nothing")).status_code == 404

                started = await client.post("/v1/auth/cloud/login")
                assert started.status_code == 202, started.text
                url = started.json()["authorization_url"]
                assert url.startswith(f"{protected.base}/authorize?")
                async with httpx.AsyncClient(follow_redirects=True, timeout=10) as browser:
                    assert (await browser.get(url)).status_code == 200

                async def authorized() -> bool:
                    state = (await client.get("/v1/auth/cloud")).json()
                    return bool(state["authorized"] and state["login"]["state"] == "authorized")

                for _ in range(200):
                    if await authorized():
                        break
                    await anyio.sleep(0.05)
                assert await authorized()
                await eventually(lambda: location.server_health()["cloud"].state == "ready",
                                 what="ready after the login")
