"""The console's login button for a server that needs OAuth: against a real OAuth-protected
server (tests/bridges/oauth_server.py), the servers page offers the button, pressing it sends
the browser to the authorization page, whose redirect reaches the daemon's loopback callback;
the server becomes ready."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from sidecar import Location
from sidecar.serve.app import build_app
from tests.bridges.helpers import eventually
from tests.bridges.oauth_server import OAuthServer
from tests.live_server import live_server

pytestmark = pytest.mark.anyio
TOKEN = "t" * 64


async def test_the_login_button_authorizes_a_server(tmp_path: Path) -> None:
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
            ) as console:
                assert (await console.post("/ui/login", data={"token": TOKEN})).status_code == 303
                page = (await console.get("/ui")).text
                assert "needs_auth" in page and 'action="/ui/servers/cloud/login"' in page
                csrf = re.search(r'name=csrf value="([^"]+)"', page)
                assert csrf is not None
                pressed = await console.post("/ui/servers/cloud/login",
                                             data={"csrf": csrf.group(1)})
                assert pressed.status_code == 303
                url = pressed.headers["location"]
                assert url.startswith(f"{protected.base}/authorize?")
                async with httpx.AsyncClient(follow_redirects=True, timeout=10) as browser:
                    assert (await browser.get(url)).status_code == 200
                await eventually(lambda: location.server_health()["cloud"].state == "ready",
                                 what="ready after the login")
                unknown = await console.post("/ui/servers/nothing/login",
                                             data={"csrf": csrf.group(1)})
                assert unknown.status_code == 400 and "OAuth" in unknown.text
